"""Declarations read from ``profiles/``: profiles, levers, shapes, hardware, stacks, recorded machines,
published figures and targets, as typed values."""
