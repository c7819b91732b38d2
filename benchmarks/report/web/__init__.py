"""The static site of the results (``nox -s site``), rebuilt whole from the result files."""
