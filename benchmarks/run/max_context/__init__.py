"""The max-context search: each contender's longest GRPO step within one memory budget, and the verdict."""
