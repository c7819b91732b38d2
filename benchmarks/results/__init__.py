"""The result files' contract: typed records, their JSON, the schema version, the one writer and loader."""
