"""Reward-function throughput under pytest-benchmark, a runner of its own."""
