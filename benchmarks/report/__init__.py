"""What is made from result files only: what tables and the site share here, the tables and the ledger
(``markdown/``), the site (``web/``)."""
