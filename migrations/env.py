"""Alembic environment: the ledger's metadata, one URL from the caller, online migrations only."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import Connection

from grove.ledger.database import open_engine
from grove.ledger.schema import METADATA

config = context.config


def _url() -> str:
    given = config.attributes.get("url") or context.get_x_argument(as_dictionary=True).get("url")
    url = given or os.environ.get("GROVE_DATABASE_URL") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit("Grove's migrations need a database URL: -x url=URL or GROVE_DATABASE_URL")
    return str(url)


def _include_object(
    obj: object, name: str | None, type_: str, reflected: bool, compare_to: object
) -> bool:
    # Alembic's own version table is not part of the ledger schema.
    return not (type_ == "table" and name == "alembic_version")


def run_migrations_online() -> None:
    """Run migrations on a connection given by the caller, or on a fresh engine."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = open_engine(_url(), pool=False)
    try:
        with engine.connect() as conn:
            _run(conn)
            conn.commit()
    finally:
        engine.dispose()


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=METADATA,
        render_as_batch=connection.dialect.name == "sqlite",
        include_object=_include_object,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("Grove's migrations run online only: give a database URL")
run_migrations_online()
