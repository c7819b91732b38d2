"""The tables under ``results/tables/``, the claims ledger, comparisons and their figures."""
