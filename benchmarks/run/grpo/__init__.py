"""Timed GRPO steps: one configuration's ranks launched, listened to and sampled, and the worker they run."""
