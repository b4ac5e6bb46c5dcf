"""Projections folded by every append: per-stream fold marks, recorded contradictions, views.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30

Compatibility: additive for writers and readers of the events; the projection tables are
derived data and are emptied. From this revision on, ``EventStore.append`` folds its events into
the projection tables in its own transaction (``ledger/inline_fold.py``), so the views are current
at every commit; a writer of 0003 would append without folding (``catch_up`` folds it later).
- ``grove_proj_streams``: each stream's last folded version, which an append moves by
  compare-and-set (a stream is folded whole, in order, once).
- ``grove_proj_contradictions``: the events the attempt lifecycle leaves out, with the fold's
  words (``AttemptState.contradictions``), one row per event.
- The projection tables and checkpoints are emptied: rows folded before this revision followed
  other rules (a second commit or selection replaced the first). ``catch_up`` (``grove lineage``,
  ``grove train``, ``grove serve``), or the next append to a stream, folds them again.
- The views are re-created from ``ledger/views.py``: ``grove_rollouts`` gains
  ``contradictions`` (last), and ``grove_contradictions`` is new.
- Downgrade drops the two tables and the new view, empties the projections (they are folded
  again by 0003's ``catch_up``) and re-creates the views of 0003.
"""

from __future__ import annotations

import importlib

import sqlalchemy as sa
from alembic import op

from grove.ledger.views import create_view_statements, drop_view_statements

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# 0003 keeps the SQL of the views it created; a migration module's name is not an identifier.
_0003 = importlib.import_module("grove.migrations.versions.0003_call_policy_version")

_DERIVED = (
    "grove_proj_rollouts",
    "grove_proj_calls",
    "grove_proj_attempts",
    "grove_projection_checkpoints",
)


def _empty_projections() -> None:
    for table in _DERIVED:
        op.execute(f"DELETE FROM {table}")


def upgrade() -> None:
    for statement in _0003.drop_view_statements():
        op.execute(statement)
    op.create_table(
        "grove_proj_streams",
        sa.Column("stream_id", sa.String(200), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.PrimaryKeyConstraint("stream_id", name="pk_grove_proj_streams"),
    )
    op.create_table(
        "grove_proj_contradictions",
        sa.Column("capture_key", sa.String(200), nullable=False),
        sa.Column("stream_version", sa.Integer, nullable=False),
        sa.Column("position", sa.BigInteger, nullable=False),
        sa.Column("event_type", sa.String(64), nullable=False),
        sa.Column("call_id", sa.String(200), nullable=True),
        sa.Column("contradiction", sa.String, nullable=False),
        sa.PrimaryKeyConstraint(
            "capture_key", "stream_version", name="pk_grove_proj_contradictions"
        ),
    )
    _empty_projections()
    for statement in create_view_statements():
        op.execute(statement)


def downgrade() -> None:
    for statement in drop_view_statements():
        op.execute(statement)
    op.drop_table("grove_proj_contradictions")
    op.drop_table("grove_proj_streams")
    _empty_projections()
    for statement in _0003.create_view_statements():
        op.execute(statement)
