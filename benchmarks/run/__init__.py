"""Running the parts on this machine: the machine (``machine/``), timed GRPO steps (``grpo/``), the decode
sweep (``decode/``), the max-context search (``max_context/``), and what every part shares."""
