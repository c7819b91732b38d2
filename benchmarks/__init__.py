"""grpo-bench: the harness (profiles, runners, result files) and its pytest-benchmark modules."""
