"""Each call's policy version: a column of ``grove_proj_calls`` and of the ``grove_calls`` view.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30

Compatibility: additive; breaks no reader or writer of 0002. ``call.intended`` and
``call.committed`` gained an optional ``policy_version`` (``docs/events.md``); events written
before it read as NULL, and no event is rewritten.
- ``grove_proj_calls`` gains ``policy_version`` (nullable): the committed call's version, else the
  intended one. On SQLite this is an ``ALTER TABLE … ADD COLUMN``: no table is rebuilt, and
  ``grove_events`` (with its append-only triggers) is not touched. Rows folded before this
  revision hold NULL until the projections are rebuilt (``grove.ledger.catch_up.rebuild``).
- The views are dropped and re-created (``VIEWS`` below, frozen when 0004 changed them):
  ``grove_calls`` gains the column ``policy_version`` (last); the other views are unchanged.
- Downgrade drops the views, the column (SQLite rebuilds ``grove_proj_calls``, a projection
  without triggers) and re-creates the views of 0002.
"""

from __future__ import annotations

import importlib

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

# 0002 keeps the SQL of the views it created; a migration module's name is not an identifier.
_0002 = importlib.import_module("grove.migrations.versions.0002_projections_and_views")

# The views of this revision, frozen when 0004 changed them (0004 re-creates them from
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
                   AS captured_calls
        FROM grove_proj_rollouts r
        JOIN grove_proj_attempts a ON a.capture_key = r.capture_key
    """,
}


def create_view_statements() -> tuple[str, ...]:
    """``CREATE VIEW`` statements for this revision's views."""
    return tuple(f"CREATE VIEW {name} AS {body.strip()}" for name, body in VIEWS.items())


def drop_view_statements() -> tuple[str, ...]:
    """``DROP VIEW`` statements for this revision's views, in reverse order of creation."""
    return tuple(f"DROP VIEW IF EXISTS {name}" for name in reversed(VIEWS))


def upgrade() -> None:
    for statement in _0002.drop_view_statements():
        op.execute(statement)
    op.add_column("grove_proj_calls", sa.Column("policy_version", sa.Integer, nullable=True))
    for statement in create_view_statements():
        op.execute(statement)


def downgrade() -> None:
    for statement in drop_view_statements():
        op.execute(statement)
    with op.batch_alter_table("grove_proj_calls", recreate="auto") as batch:
        batch.drop_column("policy_version")
    for statement in _0002.create_view_statements():
        op.execute(statement)
