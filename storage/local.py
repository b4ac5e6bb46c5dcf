"""The local-directory backend: durable write-once puts by temp file and hard link, on fsspec's
local fs.

A put writes the bytes to a temporary file next to the key (a name starting with ``.``, which is
never a key) and hard-links it to the key's path: ``link`` fails if the path exists, so the key is
created atomically, at most once, and only ever holds complete bytes — a crash mid-write leaves a
temporary file (removed with its staging partition), never a truncated blob.

A put returns only once the blob is durable, so that the ``call.committed`` event appended after
it never names a blob a power loss could take back (``docs/reliability.md``, "Durability"), in
this order: every directory it creates is fsynced into its parent; the temporary file's bytes are
fsynced before the link; after the link (and the temporary name's removal) the key's directory is
fsynced, which makes the new name durable.
"""

from __future__ import annotations

import contextlib
import os
import shutil

from fsspec.implementations.local import LocalFileSystem

__all__ = ["LocalBackend", "sync_directory"]

_CREATE_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
_DIRECTORY = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)


def sync_directory(path: str) -> None:
    """fsync the directory ``path``: the names created or removed in it are then durable."""
    fd = os.open(path, _DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _make_directories(directory: str) -> None:
    """Create ``directory`` and any missing parents, each made durable in its parent."""
    parent = os.path.dirname(directory)
    if parent and parent != directory and not os.path.isdir(parent):
        _make_directories(parent)
    with contextlib.suppress(FileExistsError):  # a concurrent put created it
        os.mkdir(directory)
    sync_directory(parent or ".")


class LocalBackend:
    """Write-once, durable puts and deletes in a local directory; reads and listings go through
    ``fs``."""

    name = "local"

    def __init__(self, fs: LocalFileSystem | None = None) -> None:
        self.fs = fs or LocalFileSystem()

    def create(self, path: str, data: bytes) -> None:
        """Store ``data`` at ``path`` unless it exists (then ``FileExistsError``), atomically,
        returning once it is on disk (module docstring)."""
        directory, name = os.path.split(path)
        temporary = f"{directory}/.{name}.{os.urandom(8).hex()}.tmp"
        try:
            fd = os.open(temporary, _CREATE_NEW, 0o644)
        except FileNotFoundError:  # the first blob of its directory
            _make_directories(directory)
            fd = os.open(temporary, _CREATE_NEW, 0o644)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.link(temporary, path)
        finally:
            os.unlink(temporary)
        sync_directory(directory)

    def delete(self, paths: list[str]) -> None:
        """Delete ``paths``; absent paths are fine."""
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def remove_tree(self, path: str) -> None:
        """Delete the directory ``path`` with everything left in it (temporary files)."""
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(path)
