"""grpo-bench: catalogs -> the models -> running -> result files -> reports -> commands (README, Layout)."""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent  # the checkout: profiles/, results/
