"""grpo-bench: profiles and catalogs -> running -> result files -> reports (see README, Layout)."""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent  # the checkout: profiles/, results/
