"""The event ledger: the append-only ``grove_events`` table.

Revision ID: 0001
Revises:
Create Date: 2026-11-29

Compatibility: the first revision.
- ``grove_events`` with its unique event id, unique (stream, version) and the
  (transaction_id, position) index of the gap-free reader.
- PostgreSQL: ``transaction_id`` defaults to the writing transaction's xid8.
- Both: triggers that refuse UPDATE and DELETE (and TRUNCATE on PostgreSQL).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

from grove.ledger.ddl import (
    append_only_statements,
    drop_append_only_statements,
    transaction_id_default_statements,
)

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    op.create_table(
        "grove_events",
        sa.Column(
            "position",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("event_id", sa.String(64), nullable=False),
        sa.Column("stream_id", sa.String(200), nullable=False),
        sa.Column("stream_version", sa.Integer, nullable=False),
        sa.Column("event_type", sa.String(64), nullable=False),
        sa.Column("schema_version", sa.Integer, nullable=False),
        sa.Column("payload", sa.JSON().with_variant(JSONB(), "postgresql"), nullable=False),
        sa.Column(
            "recorded_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("CURRENT_TIMESTAMP"),
        ),
        sa.Column("transaction_id", sa.BigInteger, nullable=True),
        sa.PrimaryKeyConstraint("position", name="pk_grove_events"),
        sa.UniqueConstraint("event_id", name="uq_grove_events_event_id"),
        sa.UniqueConstraint(
            "stream_id", "stream_version", name="uq_grove_events_stream_id_stream_version"
        ),
        sqlite_autoincrement=True,
    )
    op.create_index(
        "ix_grove_events_transaction_id_position", "grove_events", ["transaction_id", "position"]
    )
    for statement in transaction_id_default_statements(dialect):
        op.execute(statement)
    for statement in append_only_statements(dialect):
        op.execute(statement)


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    for statement in drop_append_only_statements(dialect):
        op.execute(statement)
    op.drop_index("ix_grove_events_transaction_id_position", table_name="grove_events")
    op.drop_table("grove_events")
