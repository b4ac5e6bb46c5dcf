"""Forks in the projections and the lineage views: a fork's calls reach their source's ancestry.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-06

Compatibility: additive for writers and readers of the events, and for queries that name their
columns; a query that reads ``grove_call_lineage`` by position sees one more column (last).
No event is rewritten. A Grove of 0005 refuses the upgraded ledger (its schema is ahead), so no
fork is folded without the new columns after the upgrade; ``grove db check`` compares them with
the fold of the events, and ``grove db rebuild-projections`` folds them again.
- ``grove_proj_attempts`` gains ``fork_source_capture_key`` and ``fork_source_call_id``
  (``attempt.opened.fork_from``; NULL unless the attempt is a fork) and an index on the pair
  (the forks of one call, ``docs/sql.md``).
- ``grove_proj_calls`` gains ``source_capture_key`` (``call.intended.source_capture_key``: the
  attempt that owns the call's parent, NULL unless that is another attempt).
- Both are filled from the events the rows were folded from: each row names the position of the
  event that stands for it (``opened_position``, ``intended_position``), so one primary-key
  look-up per attempt, and per continuation of a fork, reads the value. Attempts not folded yet
  are folded with the columns by ``catch_up`` or the next append. (A name holding U+0000 or
  U+FFFF, which the PostgreSQL event table stores escaped, is folded exactly by ``grove db
  rebuild-projections``.)
- The views are re-created from ``ledger/views.py``: ``grove_calls`` gains
  ``source_capture_key`` (last); ``grove_call_lineage`` gains ``ancestor_capture_key`` (last) and
  follows a call's parent into the attempt that owns it, so a fork's call reaches the source call
  and its ancestors, on into a source's own source.
- Downgrade drops the views, the index and the columns (on SQLite the two projection tables are
  rebuilt; neither has triggers) and re-creates the views of 0004.
"""

from __future__ import annotations

import importlib

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

from grove.ledger.views import create_view_statements, drop_view_statements

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# 0004 keeps the SQL of the views it created; a migration module's name is not an identifier.
_0004 = importlib.import_module("grove.migrations.versions.0004_inline_projections")

_INDEX = "ix_grove_proj_attempts_fork_source"

# The tables as this revision reads them (not ledger/schema.py, which follows the head).
_EVENTS = sa.table(
    "grove_events",
    sa.column("position", sa.BigInteger),
    sa.column("payload", sa.JSON().with_variant(JSONB(), "postgresql")),
)
_ATTEMPTS = sa.table(
    "grove_proj_attempts",
    sa.column("capture_key", sa.String),
    sa.column("opened_position", sa.BigInteger),
    sa.column("fork_source_capture_key", sa.String),
    sa.column("fork_source_call_id", sa.String),
)
_CALLS = sa.table(
    "grove_proj_calls",
    sa.column("capture_key", sa.String),
    sa.column("decision", sa.String),
    sa.column("intended_position", sa.BigInteger),
    sa.column("source_capture_key", sa.String),
)


def _payload_text(position: sa.ColumnElement[int], *path: str) -> sa.ScalarSelect[str]:
    """The string at ``path`` of the payload of the event at ``position`` (NULL when absent)."""
    return (
        sa.select(_EVENTS.c.payload[path].as_string())
        .where(_EVENTS.c.position == position)
        .scalar_subquery()
    )


def _backfill() -> None:
    source_key = _payload_text(_ATTEMPTS.c.opened_position, "fork_from", "source_capture_key")
    source_call = _payload_text(_ATTEMPTS.c.opened_position, "fork_from", "source_call_id")
    op.execute(
        sa.update(_ATTEMPTS)
        .where(source_key.is_not(None))
        .values(fork_source_capture_key=source_key, fork_source_call_id=source_call)
    )
    # Only a fork's continuations can have a parent in another attempt.
    forks = sa.select(_ATTEMPTS.c.capture_key).where(
        _ATTEMPTS.c.fork_source_capture_key.is_not(None)
    )
    op.execute(
        sa.update(_CALLS)
        .where(_CALLS.c.decision == "continuation", _CALLS.c.capture_key.in_(forks))
        .values(source_capture_key=_payload_text(_CALLS.c.intended_position, "source_capture_key"))
    )


def upgrade() -> None:
    for statement in drop_view_statements(_0004.VIEWS):
        op.execute(statement)
    op.add_column(
        "grove_proj_attempts", sa.Column("fork_source_capture_key", sa.String(200), nullable=True)
    )
    op.add_column(
        "grove_proj_attempts", sa.Column("fork_source_call_id", sa.String(200), nullable=True)
    )
    op.create_index(
        _INDEX, "grove_proj_attempts", ["fork_source_capture_key", "fork_source_call_id"]
    )
    op.add_column(
        "grove_proj_calls", sa.Column("source_capture_key", sa.String(200), nullable=True)
    )
    _backfill()
    for statement in create_view_statements():
        op.execute(statement)


def downgrade() -> None:
    for statement in drop_view_statements():
        op.execute(statement)
    op.drop_index(_INDEX, table_name="grove_proj_attempts")
    with op.batch_alter_table("grove_proj_calls", recreate="auto") as batch:
        batch.drop_column("source_capture_key")
    with op.batch_alter_table("grove_proj_attempts", recreate="auto") as batch:
        batch.drop_column("fork_source_call_id")
        batch.drop_column("fork_source_capture_key")
    for statement in create_view_statements(_0004.VIEWS):
        op.execute(statement)
