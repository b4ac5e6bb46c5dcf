"""Check constraints on events; projection tables; the lineage views.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29

Compatibility: additive for readers and writers of 0001. Events with a stream or schema version
below 1 were never written by Grove and are now refused by the database as well.
- ``grove_events`` gains ``stream_version >= 1`` and ``schema_version >= 1`` checks. On SQLite the
  table is recreated (batch mode), which drops its triggers and AUTOINCREMENT: both are restored
  here (``tests/integration/ledger/test_migrations.py`` proves they survive).
- Projection tables for attempts, calls and rollouts, with a checkpoint table.
- Views ``grove_calls``, ``grove_call_lineage`` and ``grove_rollouts``, as this revision defines
  them (``VIEWS`` below, a frozen copy: later revisions re-create them from ``ledger/views.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa
from alembic import op
from alembic.operations import BatchOperations

from grove.ledger.ddl import append_only_statements, drop_append_only_statements

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

CHECKS = {
    "stream_version_positive": "stream_version >= 1",
    "schema_version_positive": "schema_version >= 1",
}

# The views of this revision, frozen: upgrading runs them on this revision's tables whatever the
# current definitions in ledger/views.py are (0003 re-creates them from those).
VIEWS: dict[str, str] = {
    "grove_calls": """
        SELECT c.capture_key, a.rollout_id, a.prompt_group, a.rollout_index, c.call_id,
               c.parent_call_id, c.decision, c.root_reason, c.status, c.late,
               c.prompt_tokens, c.prev_len, c.delta_len, c.cum_len, c.generated_len,
               c.finish_reason, c.response_id, c.failure_reason, c.blob_key,
               c.selection_index, (c.selection_index IS NOT NULL) AS selected,
               c.intended_position, c.resolved_position
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


def _alter_events(change: Callable[[BatchOperations], None]) -> None:
    """Apply ``change`` to grove_events; on SQLite, re-make what a table rebuild loses."""
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        for statement in drop_append_only_statements(dialect):
            op.execute(statement)
    with op.batch_alter_table(
        "grove_events", recreate="auto", table_kwargs={"sqlite_autoincrement": True}
    ) as batch:
        change(batch)
    if dialect == "sqlite":
        for statement in append_only_statements(dialect):
            op.execute(statement)


def upgrade() -> None:
    def add_checks(batch: BatchOperations) -> None:
        for name, condition in CHECKS.items():
            batch.create_check_constraint(f"ck_grove_events_{name}", condition)

    _alter_events(add_checks)

    op.create_table(
        "grove_projection_checkpoints",
        sa.Column("projection", sa.String(64), nullable=False),
        sa.Column("transaction_id", sa.BigInteger, nullable=True),
        sa.Column("position", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("projection", name="pk_grove_projection_checkpoints"),
    )
    op.create_table(
        "grove_proj_attempts",
        sa.Column("capture_key", sa.String(200), nullable=False),
        sa.Column("rollout_id", sa.String(200), nullable=False),
        sa.Column("prompt_group", sa.String(200), nullable=False),
        sa.Column("rollout_index", sa.Integer, nullable=False),
        sa.Column("policy_version", sa.Integer, nullable=False),
        sa.Column("forest_mode", sa.Boolean, nullable=False),
        sa.Column("selection_policy", sa.String(200), nullable=False),
        sa.Column("admissions_closed", sa.Boolean, nullable=False),
        sa.Column("settled", sa.Boolean, nullable=False),
        sa.Column("settle_timed_out", sa.Boolean, nullable=False),
        sa.Column("cleaned", sa.Boolean, nullable=False),
        sa.Column("opened_position", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("capture_key", name="pk_grove_proj_attempts"),
    )
    op.create_index("ix_grove_proj_attempts_prompt_group", "grove_proj_attempts", ["prompt_group"])
    op.create_table(
        "grove_proj_calls",
        sa.Column("capture_key", sa.String(200), nullable=False),
        sa.Column("call_id", sa.String(200), nullable=False),
        sa.Column("parent_call_id", sa.String(200), nullable=True),
        sa.Column("decision", sa.String(16), nullable=False),
        sa.Column("root_reason", sa.String(64), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("late", sa.Boolean, nullable=False),
        sa.Column("prompt_tokens", sa.Integer, nullable=False),
        sa.Column("prev_len", sa.Integer, nullable=True),
        sa.Column("delta_len", sa.Integer, nullable=True),
        sa.Column("cum_len", sa.Integer, nullable=True),
        sa.Column("generated_len", sa.Integer, nullable=True),
        sa.Column("blob_key", sa.String(512), nullable=True),
        sa.Column("blob_sha256", sa.String(64), nullable=True),
        sa.Column("blob_bytes", sa.BigInteger, nullable=True),
        sa.Column("finish_reason", sa.String(32), nullable=True),
        sa.Column("response_id", sa.String(200), nullable=True),
        sa.Column("failure_reason", sa.String(64), nullable=True),
        sa.Column("failure_detail", sa.String, nullable=True),
        sa.Column("selection_index", sa.Integer, nullable=True),
        sa.Column("intended_position", sa.BigInteger, nullable=False),
        sa.Column("resolved_position", sa.BigInteger, nullable=True),
        sa.PrimaryKeyConstraint("capture_key", "call_id", name="pk_grove_proj_calls"),
    )
    op.create_table(
        "grove_proj_rollouts",
        sa.Column("capture_key", sa.String(200), nullable=False),
        sa.Column("rollout_id", sa.String(200), nullable=False),
        sa.Column("prompt_group", sa.String(200), nullable=False),
        sa.Column("policy", sa.String(200), nullable=False),
        sa.Column("reward", sa.Float, nullable=False),
        sa.Column("terminal_response_id", sa.String(200), nullable=True),
        sa.Column("selected_calls", sa.Integer, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("masked_reason", sa.String(64), nullable=True),
        sa.Column("rows", sa.Integer, nullable=True),
        sa.Column("step", sa.Integer, nullable=True),
        sa.Column("selected_position", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("capture_key", name="pk_grove_proj_rollouts"),
    )
    op.create_index("ix_grove_proj_rollouts_rollout_id", "grove_proj_rollouts", ["rollout_id"])
    for statement in create_view_statements():
        op.execute(statement)


def downgrade() -> None:
    for statement in drop_view_statements():
        op.execute(statement)
    op.drop_index("ix_grove_proj_rollouts_rollout_id", table_name="grove_proj_rollouts")
    op.drop_table("grove_proj_rollouts")
    op.drop_table("grove_proj_calls")
    op.drop_index("ix_grove_proj_attempts_prompt_group", table_name="grove_proj_attempts")
    op.drop_table("grove_proj_attempts")
    op.drop_table("grove_projection_checkpoints")

    def drop_checks(batch: BatchOperations) -> None:
        for name in CHECKS:
            batch.drop_constraint(f"ck_grove_events_{name}", type_="check")

    _alter_events(drop_checks)
