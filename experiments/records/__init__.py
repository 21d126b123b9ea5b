"""Episode records: the schema, the JSONL store and the cost model (docs/method.md §7)."""
