"""The time model: seconds per phase of one GRPO step, each phase work over a machine's rates."""
