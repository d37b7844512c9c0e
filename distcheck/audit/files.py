"""Reading answer keys from disk without trusting the path: regular files only, bounded in size.

:func:`read_key_bytes` opens the path without blocking (``open`` on a named pipe
with no writer would wait forever), refuses anything ``fstat`` does not call a
regular file (a pipe, a device such as ``/dev/zero``, a socket, a folder) before
reading a byte, refuses a file over :data:`MAX_KEY_BYTES`, and reads at most
that many bytes plus one, so a file that grows meanwhile cannot exhaust memory.
Every refusal is an :class:`~distcheck.errors.AnswerKeyError` naming the file
and the limit; a path of the wrong type is a :class:`~distcheck.errors.ConfigError`.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from distcheck.core.errors import AnswerKeyError, ConfigError
from distcheck.core.validate import check_type

__all__ = ["MAX_KEY_BYTES", "as_path", "path_text", "read_key_bytes"]

#: the largest answer key read, in bytes (4 MiB; the largest shipped golden key is under 30 KB)
MAX_KEY_BYTES = 4 * 2**20


def as_path(field: str, value: object) -> Path:
    """``value`` as a Path: a ``str`` or an ``os.PathLike`` naming a str path. Raises
    ConfigError naming ``field`` otherwise (an int, None, bytes, ...)."""
    check_type(field, value, (str, os.PathLike), "must be a file path (a str or os.PathLike)")
    text = os.fspath(value)  # type: ignore[call-overload]
    if not isinstance(text, str) or not text:
        raise ConfigError(field, value, "must be a non-empty str path")
    return Path(text)


def path_text(path: object) -> str:
    """The name a key is reported under: a str or os.PathLike as written (ConfigError otherwise)."""
    check_type("path", path, (str, os.PathLike), "must name the key (a str or os.PathLike)")
    return str(os.fspath(path))  # type: ignore[call-overload]


_FILE_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def read_key_bytes(p: Path) -> bytes:
    """The bytes of the regular file ``p``, at most MAX_KEY_BYTES. Opened without blocking
    (a named pipe with no writer would block ``open``) and checked with ``fstat`` before any
    read, so a pipe, a device or a folder is refused at once; the read itself stops at
    MAX_KEY_BYTES + 1 bytes, so a file that grows while it is read cannot exhaust memory."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(p, flags)
    except OSError as exc:
        raise AnswerKeyError(f"cannot read the answer key: {exc.strerror or exc}", path=str(p)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = next((name for test, name in _FILE_KINDS if test(st.st_mode)), "not a regular file")
            raise AnswerKeyError(f"is {kind}; an answer key must be a regular file", path=str(p))
        if st.st_size > MAX_KEY_BYTES:
            raise AnswerKeyError(f"is {st.st_size:,} bytes, over the answer-key limit of {MAX_KEY_BYTES:,} bytes "
                                 "(4 MiB)", path=str(p))
        chunks, size = [], 0
        while size <= MAX_KEY_BYTES:
            chunk = os.read(fd, min(MAX_KEY_BYTES + 1 - size, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise AnswerKeyError(f"cannot read the answer key: {exc.strerror or exc}", path=str(p)) from None
    finally:
        os.close(fd)
    if size > MAX_KEY_BYTES:
        raise AnswerKeyError(f"holds more than the answer-key limit of {MAX_KEY_BYTES:,} bytes (4 MiB)", path=str(p))
    return b"".join(chunks)
