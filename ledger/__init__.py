"""The system of record: event models, the append-only store, admission, replay, lineage."""
