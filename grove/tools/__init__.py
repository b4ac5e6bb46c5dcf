"""The commands that look at a ledger or a run: lineage, replay, show, report, export."""
