"""Where a command's ledger, blobs and checkpoints live: ``--workdir``, and URLs that override it.

The embedded defaults keep everything under one directory (``.grove/`` unless told otherwise):
``ledger.db`` (SQLite), ``blobs/`` (a local blob directory) and ``checkpoints/``.
``--database-url`` (``postgresql+psycopg://…``) and ``--blob-url`` (``s3://bucket/prefix``) point
elsewhere; checkpoints always stay under the workdir.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["DEFAULT_WORKDIR", "Workspace"]

DEFAULT_WORKDIR = Path(".grove")


@dataclass(frozen=True)
class Workspace:
    """The resolved locations one command works with."""

    workdir: Path
    database_url: str
    blob_url: str

    @classmethod
    def resolve(
        cls,
        workdir: Path | None = None,
        database_url: str | None = None,
        blob_url: str | None = None,
    ) -> Workspace:
        """Fill in the embedded defaults under ``workdir`` for whatever was not given."""
        root = (workdir or DEFAULT_WORKDIR).expanduser().resolve()
        return cls(
            workdir=root,
            database_url=database_url or f"sqlite:///{root / 'ledger.db'}",
            blob_url=blob_url or str(root / "blobs"),
        )

    @staticmethod
    def redacted(url: str) -> str:
        """``url`` with any password hidden, for printing."""
        if "://" not in url:
            return url
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)

    @property
    def checkpoints(self) -> Path:
        """The directory holding training checkpoints."""
        return self.workdir / "checkpoints"
