"""Crash-safe file writes for the data caches and the trainer's checkpoints.

A process killed while ``torch.save`` writes a file leaves a truncated file
behind; a later run that trusts the name then fails on every start
(``failed reading zip archive``).  :func:`atomic_write` writes to a temporary
file in the *same* directory and renames it over the target with
:func:`os.replace`, which is atomic on POSIX and Windows: a reader sees either
the old complete file or the new complete file, never a partial one.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Any, Callable, Iterator

import torch

__all__ = ["atomic_write", "atomic_torch_save", "short_error"]


@contextlib.contextmanager
def atomic_write(path: str, fsync: bool = True) -> Iterator[str]:
    """Yield a temporary path next to ``path``; on success move it onto ``path``.

    The caller writes the whole file to the yielded path.  If the block raises
    (or the process dies), ``path`` is untouched and the temporary file is
    removed (or, after a kill, left as a hidden ``.<name>.*.tmp`` file that no
    reader looks at).  With ``fsync`` the data is flushed to disk before the
    rename, so the rename never publishes a file whose blocks are not written.
    """
    path = os.fspath(path)
    d, name = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=f".{name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield tmp
        if fsync:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    if fsync:  # make the rename itself durable (best effort: not every OS / FS allows it)
        with contextlib.suppress(OSError):
            dfd = os.open(d, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)


def atomic_torch_save(obj: Any, path: str, save: Callable[[Any, str], None] = torch.save,
                      fsync: bool = True) -> None:
    """``save(obj, tmp)`` then ``os.replace(tmp, path)`` (see :func:`atomic_write`)."""
    with atomic_write(path, fsync=fsync) as tmp:
        save(obj, tmp)


def short_error(e: BaseException, limit: int = 160) -> str:
    """``"Type: first sentence of the message"`` on one line (for log / error lines)."""
    msg = " ".join(str(e).split())
    cut = msg.find(". ")
    if cut > 0:
        msg = msg[:cut + 1]
    if len(msg) > limit:
        msg = msg[:limit - 3] + "..."
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__
