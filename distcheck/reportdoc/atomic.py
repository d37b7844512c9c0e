"""Atomic file writes: a temporary file in the same folder, then a rename.

An interrupted run (an exception, Ctrl-C, SIGTERM unwinding through ``finally``)
leaves either the old file or the new one, never a half-written one, and no
temporary file behind: the temporary file is removed on every exit path.
``os.replace`` is atomic when source and target are on the same file system,
which a temporary file in the target's own folder guarantees.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

__all__ = ["atomic_write"]


def atomic_write(path: str | os.PathLike, data: bytes | str, *, encoding: str = "utf-8") -> Path:
    """Write ``data`` to ``path`` atomically and return the path.

    ``data`` is bytes, or text encoded with ``encoding`` (default UTF-8). The
    temporary file ``.<name>.<random>.tmp`` is created beside ``path`` with the
    usual permissions (0o666 less the umask, like ``open(path, "w")``), written,
    flushed to disk, and renamed over ``path``.

    Raises:
        OSError: the folder does not exist or is not writable, or ``path`` is a
        folder (nothing is left behind).
        TypeError: ``data`` is neither bytes nor str.
    """
    target = Path(path)
    if isinstance(data, str):
        payload = data.encode(encoding)
    elif isinstance(data, (bytes, bytearray, memoryview)):
        payload = bytes(data)
    else:
        raise TypeError(f"data must be bytes or str, not {type(data).__name__}")
    if target.is_dir():
        raise IsADirectoryError(21, "is a folder", str(target))
    while True:
        tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileExistsError:  # pragma: no cover - 48 random bits collided
            continue
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return target
