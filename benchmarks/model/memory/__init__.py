"""The memory model: predicted bytes per term and phase of one GRPO step, per rank."""
