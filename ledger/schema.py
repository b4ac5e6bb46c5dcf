"""The ledger schema, declared once: the event table and the projection tables built from it.

Queries are built from these ``Table`` objects; Alembic migrations (``migrations/versions``) create
the same shapes and ``alembic check`` proves they agree. Dialect-specific objects that SQLAlchemy
cannot declare (append-only triggers, the transaction-id default, views) live in ``ddl.py`` and
``views.py``.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

__all__ = [
    "EVENTS",
    "METADATA",
    "PROJECTION_TABLES",
    "PROJ_ATTEMPTS",
    "PROJ_CALLS",
    "PROJ_CHECKPOINTS",
    "PROJ_CONTRADICTIONS",
    "PROJ_ROLLOUTS",
    "PROJ_STREAMS",
    "JsonType",
    "PositionType",
]

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "pk": "pk_%(table_name)s",
}
METADATA = MetaData(naming_convention=NAMING)

# SQLite makes only an INTEGER PRIMARY KEY an alias of the rowid (and AUTOINCREMENT needs it).
PositionType = BigInteger().with_variant(Integer(), "sqlite")
JsonType = JSON().with_variant(JSONB(), "postgresql")

EVENTS = Table(
    "grove_events",
    METADATA,
    # Global order of appends; AUTOINCREMENT on SQLite so a position is never reused.
    Column("position", PositionType, primary_key=True, autoincrement=True),
    # Idempotency key: a retried append with the same id and payload returns this row.
    Column("event_id", String(64), nullable=False, unique=True),
    Column("stream_id", String(200), nullable=False),
    Column("stream_version", Integer, nullable=False),
    Column("event_type", String(64), nullable=False),
    Column("schema_version", Integer, nullable=False),
    Column("payload", JsonType, nullable=False),
    Column(
        "recorded_at",
        DateTime(timezone=True),
        nullable=False,
        server_default=text("CURRENT_TIMESTAMP"),
    ),
    # PostgreSQL: the writing transaction's xid8 (as bigint), filled by a column default; the
    # gap-free reader reads below the oldest running transaction. NULL on SQLite.
    Column("transaction_id", BigInteger, nullable=True),
    # Optimistic concurrency: one event per stream version; a racing append fails here.
    UniqueConstraint("stream_id", "stream_version"),
    CheckConstraint("stream_version >= 1", name="stream_version_positive"),
    CheckConstraint("schema_version >= 1", name="schema_version_positive"),
    # The gap-free reader's scan order on PostgreSQL.
    Index(None, "transaction_id", "position"),
    # The published steps, a few among millions of events (``grove replay --verify``).
    Index(
        "ix_grove_events_published_position",
        "position",
        postgresql_where=text("event_type = 'batch.published'"),
        sqlite_where=text("event_type = 'batch.published'"),
    ),
    sqlite_autoincrement=True,
)

PROJ_CHECKPOINTS = Table(
    "grove_projection_checkpoints",
    METADATA,
    Column("projection", String(64), primary_key=True),
    Column("transaction_id", BigInteger, nullable=True),
    Column("position", BigInteger, nullable=False),
)

PROJ_ATTEMPTS = Table(
    "grove_proj_attempts",
    METADATA,
    Column("capture_key", String(200), primary_key=True),
    Column("rollout_id", String(200), nullable=False),
    Column("prompt_group", String(200), nullable=False),
    Column("rollout_index", Integer, nullable=False),
    Column("policy_version", Integer, nullable=False),
    Column("forest_mode", Boolean, nullable=False),
    Column("selection_policy", String(200), nullable=False),
    Column("admissions_closed", Boolean, nullable=False),
    Column("settled", Boolean, nullable=False),
    Column("settle_timed_out", Boolean, nullable=False),
    Column("cleaned", Boolean, nullable=False),
    Column("opened_position", BigInteger, nullable=False),
    # A fork's source: call ``fork_source_call_id`` of attempt ``fork_source_capture_key``
    # (``attempt.opened.fork_from``); both NULL when the attempt is not a fork.
    Column("fork_source_capture_key", String(200), nullable=True),
    Column("fork_source_call_id", String(200), nullable=True),
    # Rollouts of one prompt group are assembled together.
    Index(None, "prompt_group"),
    # ``grove lineage KEY`` finds an attempt by capture key or by rollout id.
    Index(None, "rollout_id"),
    # The forks of one call (``docs/sql.md``); named, as the convention's name passes
    # PostgreSQL's 63 characters.
    Index("ix_grove_proj_attempts_fork_source", "fork_source_capture_key", "fork_source_call_id"),
)

PROJ_CALLS = Table(
    "grove_proj_calls",
    METADATA,
    Column("capture_key", String(200), primary_key=True),
    Column("call_id", String(200), primary_key=True),
    Column("parent_call_id", String(200), nullable=True),
    Column("decision", String(16), nullable=False),
    Column("root_reason", String(64), nullable=True),
    Column("status", String(16), nullable=False),
    Column("late", Boolean, nullable=False),
    Column("prompt_tokens", Integer, nullable=False),
    Column("prev_len", Integer, nullable=True),
    Column("delta_len", Integer, nullable=True),
    Column("cum_len", Integer, nullable=True),
    Column("generated_len", Integer, nullable=True),
    Column("blob_key", String(512), nullable=True),
    Column("blob_sha256", String(64), nullable=True),
    Column("blob_bytes", BigInteger, nullable=True),
    Column("finish_reason", String(32), nullable=True),
    Column("response_id", String(200), nullable=True),
    Column("failure_reason", String(64), nullable=True),
    Column("failure_detail", String, nullable=True),
    Column("selection_index", Integer, nullable=True),
    Column("intended_position", BigInteger, nullable=False),
    Column("resolved_position", BigInteger, nullable=True),
    # The committed call's policy version, else the intended one; NULL when neither says.
    Column("policy_version", Integer, nullable=True),
    # The attempt that owns ``parent_call_id`` when it is not this one (a fork's call whose
    # parent is the fork source, ``call.intended.source_capture_key``); NULL otherwise.
    Column("source_capture_key", String(200), nullable=True),
)

PROJ_ROLLOUTS = Table(
    "grove_proj_rollouts",
    METADATA,
    Column("capture_key", String(200), primary_key=True),
    Column("rollout_id", String(200), nullable=False),
    Column("prompt_group", String(200), nullable=False),
    Column("policy", String(200), nullable=False),
    Column("reward", Float, nullable=False),
    Column("terminal_response_id", String(200), nullable=True),
    Column("selected_calls", Integer, nullable=False),
    Column("status", String(16), nullable=False),
    Column("masked_reason", String(64), nullable=True),
    Column("rows", Integer, nullable=True),
    Column("step", Integer, nullable=True),
    Column("selected_position", BigInteger, nullable=False),
    # The trainer looks rollouts up by logical id.
    Index(None, "rollout_id"),
    # ``grove replay --verify`` reads the rollouts of a step's prompt groups.
    Index(None, "prompt_group"),
)

# The events of each stream folded into the projections: its last stream version folded.
PROJ_STREAMS = Table(
    "grove_proj_streams",
    METADATA,
    Column("stream_id", String(200), primary_key=True),
    Column("version", Integer, nullable=False),
)

# Events the lifecycle rules leave out of an attempt (``AttemptState.contradictions``).
PROJ_CONTRADICTIONS = Table(
    "grove_proj_contradictions",
    METADATA,
    Column("capture_key", String(200), primary_key=True),
    Column("stream_version", Integer, primary_key=True),
    Column("position", BigInteger, nullable=False),
    Column("event_type", String(64), nullable=False),
    Column("call_id", String(200), nullable=True),
    Column("contradiction", String, nullable=False),
)

PROJECTION_TABLES = (PROJ_ATTEMPTS, PROJ_CALLS, PROJ_ROLLOUTS, PROJ_CONTRADICTIONS)
