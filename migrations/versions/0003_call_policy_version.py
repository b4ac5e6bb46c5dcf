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
  revision hold NULL until the projections are rebuilt (``ledger.projections.rebuild``).
- The views are dropped and re-created from ``ledger/views.py``: ``grove_calls`` gains the
  column ``policy_version`` (last); the other views are unchanged.
- Downgrade drops the views, the column (SQLite rebuilds ``grove_proj_calls``, a projection
  without triggers) and re-creates the views of 0002.
"""

from __future__ import annotations

import importlib

import sqlalchemy as sa
from alembic import op

from ledger.views import create_view_statements, drop_view_statements

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

# 0002 keeps the SQL of the views it created; a migration module's name is not an identifier.
_0002 = importlib.import_module("migrations.versions.0002_projections_and_views")


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
