"""The local-directory backend: write-once puts by temp file and hard link, on fsspec's local fs.

A put writes the bytes to a temporary file next to the key (a name starting with ``.``, which is
never a key) and hard-links it to the key's path: ``link`` fails if the path exists, so the key is
created atomically, at most once, and only ever holds complete bytes — a crash mid-write leaves a
temporary file (removed with its staging partition), never a truncated blob. Writes are not
fsynced: a blob lost in a crash is detected on read (missing or digest mismatch) and masks its
rollout, as the design requires.
"""

from __future__ import annotations

import contextlib
import os
import shutil

from fsspec.implementations.local import LocalFileSystem

__all__ = ["LocalBackend"]

_CREATE_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)


class LocalBackend:
    """Write-once puts and deletes in a local directory; reads and listings go through ``fs``."""

    name = "local"

    def __init__(self, fs: LocalFileSystem | None = None) -> None:
        self.fs = fs or LocalFileSystem()

    def create(self, path: str, data: bytes) -> None:
        """Store ``data`` at ``path`` unless it exists (then ``FileExistsError``), atomically."""
        directory, name = os.path.split(path)
        temporary = f"{directory}/.{name}.{os.urandom(8).hex()}.tmp"
        try:
            fd = os.open(temporary, _CREATE_NEW, 0o644)
        except FileNotFoundError:  # the first blob of its directory
            os.makedirs(directory, exist_ok=True)
            fd = os.open(temporary, _CREATE_NEW, 0o644)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
            os.link(temporary, path)
        finally:
            os.unlink(temporary)

    def delete(self, paths: list[str]) -> None:
        """Delete ``paths``; absent paths are fine."""
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def remove_tree(self, path: str) -> None:
        """Delete the directory ``path`` with everything left in it (temporary files)."""
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(path)
