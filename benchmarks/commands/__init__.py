"""One module per command a user types (``python -m benchmarks COMMAND``): its options and its printing."""
