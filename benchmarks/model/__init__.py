"""The two models: memory (``memory/``) and time (``time/``), the recipe and defaults every answer shares
(``guide``), the search over cards and counts (``search``) and a profile against both (``profile_fit``)."""
