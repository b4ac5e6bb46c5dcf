"""Indexes for looking one attempt, rollout, group or publication up in a large ledger.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

Compatibility: additive (indexes only); breaks no reader or writer of 0004. Each index serves a
look-up that read a whole table before (``docs/scale.md``):
- ``grove_proj_attempts (rollout_id)``: ``grove lineage KEY`` finds the attempts of a capture key
  *or* a rollout id;
- ``grove_proj_rollouts (prompt_group)``: ``grove replay --verify`` reads the rollouts of a step's
  prompt groups;
- ``grove_events (position) WHERE event_type = 'batch.published'`` (partial): ``grove replay
  --verify`` reads the published steps, a few among millions of events.
Downgrade drops them.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_PUBLISHED = sa.text("event_type = 'batch.published'")


def upgrade() -> None:
    op.create_index("ix_grove_proj_attempts_rollout_id", "grove_proj_attempts", ["rollout_id"])
    op.create_index("ix_grove_proj_rollouts_prompt_group", "grove_proj_rollouts", ["prompt_group"])
    op.create_index(
        "ix_grove_events_published_position",
        "grove_events",
        ["position"],
        postgresql_where=_PUBLISHED,
        sqlite_where=_PUBLISHED,
    )


def downgrade() -> None:
    op.drop_index("ix_grove_events_published_position", table_name="grove_events")
    op.drop_index("ix_grove_proj_rollouts_prompt_group", table_name="grove_proj_rollouts")
    op.drop_index("ix_grove_proj_attempts_rollout_id", table_name="grove_proj_attempts")
