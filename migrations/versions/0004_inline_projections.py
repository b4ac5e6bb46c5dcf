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
- The views are re-created (``VIEWS`` below, frozen when 0006 changed them): ``grove_rollouts``
  gains ``contradictions`` (last), and ``grove_contradictions`` is new.
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

# The views of this revision, frozen when 0006 changed them (0006 re-creates them from
# ledger/views.py): upgrading runs these on this revision's tables.
VIEWS: dict[str, str] = {
    "grove_calls": """
        SELECT c.capture_key, a.rollout_id, a.prompt_group, a.rollout_index, c.call_id,
               c.parent_call_id, c.decision, c.root_reason, c.status, c.late,
               c.prompt_tokens, c.prev_len, c.delta_len, c.cum_len, c.generated_len,
               c.finish_reason, c.response_id, c.failure_reason, c.blob_key,
               c.selection_index, (c.selection_index IS NOT NULL) AS selected,
               c.intended_position, c.resolved_position, c.policy_version
        FROM grove_proj_calls c
        JOIN grove_proj_attempts a ON a.capture_key = c.capture_key
    """,
    "grove_call_lineage": """
        WITH RECURSIVE lineage (capture_key, call_id, ancestor_call_id, depth) AS (
            SELECT capture_key, call_id, call_id, 0 FROM grove_proj_calls
            UNION ALL
            SELECT l.capture_key, l.call_id, c.parent_call_id, l.depth + 1
            FROM lineage l
            JOIN grove_proj_calls c
              ON c.capture_key = l.capture_key AND c.call_id = l.ancestor_call_id
            WHERE c.parent_call_id IS NOT NULL
        )
        SELECT capture_key, call_id, ancestor_call_id, depth FROM lineage
    """,
    "grove_rollouts": """
        SELECT r.capture_key, r.rollout_id, r.prompt_group, a.rollout_index, a.policy_version,
               r.policy, r.reward, r.terminal_response_id, r.selected_calls, r.status,
               r.masked_reason, r.rows, r.step,
               (SELECT COUNT(*) FROM grove_proj_calls c WHERE c.capture_key = r.capture_key)
                   AS captured_calls,
               (SELECT COUNT(*) FROM grove_proj_contradictions x
                 WHERE x.capture_key = r.capture_key) AS contradictions
        FROM grove_proj_rollouts r
        JOIN grove_proj_attempts a ON a.capture_key = r.capture_key
    """,
    "grove_contradictions": """
        SELECT x.capture_key, a.rollout_id, x.stream_version, x.position, x.event_type,
               x.call_id, x.contradiction
        FROM grove_proj_contradictions x
        LEFT JOIN grove_proj_attempts a ON a.capture_key = x.capture_key
    """,
}


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
    for statement in create_view_statements(VIEWS):
        op.execute(statement)


def downgrade() -> None:
    for statement in drop_view_statements(VIEWS):
        op.execute(statement)
    op.drop_table("grove_proj_contradictions")
    op.drop_table("grove_proj_streams")
    _empty_projections()
    for statement in _0003.create_view_statements():
        op.execute(statement)
