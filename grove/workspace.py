"""Where a command's ledger, blobs and checkpoints live: ``--workdir``, and URLs that override it.

The embedded defaults keep everything under one directory (``.grove/`` unless told otherwise):
``ledger.db`` (SQLite), ``blobs/`` (a local blob directory) and ``checkpoints/``.
``--database-url`` (``postgresql+psycopg://…``) and ``--blob-url`` (``s3://bucket/prefix``) point
elsewhere; checkpoints always stay under the workdir.

Commands that only read the ledger (lineage, replay, show, gc) open it through
:meth:`Workspace.existing_ledger`, so that pointing one at an empty or mistyped workdir reports
:class:`LedgerNotFound` instead of creating an empty ledger there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from grove.ledger.errors import LedgerError

__all__ = ["DEFAULT_WORKDIR", "LedgerNotFound", "Workspace"]

DEFAULT_WORKDIR = Path(".grove")


class LedgerNotFound(LedgerError):
    """A command that reads the ledger was pointed at a SQLite file that does not exist; nothing
    was created."""

    def __init__(self, url: str, path: Path) -> None:
        self.url = url
        self.path = path
        super().__init__(
            f"No ledger at {path}: nothing has been recorded there, and reading commands never "
            "create a ledger. Point --workdir or --database-url at an existing ledger, or "
            "record into this one first (grove serve, grove train, grove demo)"
        )


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

    def existing_ledger(self) -> str:
        """``database_url``, once it names a ledger that exists: a SQLite file must be there
        (:class:`LedgerNotFound` otherwise); a server database is checked when it is opened."""
        from sqlalchemy.engine import make_url

        url = make_url(self.database_url)
        if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
            path = Path(url.database)
            if not path.is_file():
                raise LedgerNotFound(self.redacted(self.database_url), path)
        return self.database_url

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
