"""Reading answer keys from disk without trusting the path: regular files only, bounded in size.

:func:`read_key_bytes` opens the path without blocking (``open`` on a named pipe
with no writer would wait forever), refuses anything ``fstat`` does not call a
regular file (a pipe, a device such as ``/dev/zero``, a socket, a folder) before
reading a byte, refuses a file over :data:`MAX_KEY_BYTES`, and reads at most
that many bytes plus one, so a file that grows meanwhile cannot exhaust memory.
Every refusal is an :class:`~distcheck.core.errors.AnswerKeyError` naming the file
and the limit; a path of the wrong type is a :class:`~distcheck.core.errors.ConfigError`.
"""

from __future__ import annotations

import os
from pathlib import Path

from distcheck.core.errors import AnswerKeyError, ConfigError
from distcheck.core.files import MAX_INPUT_BYTES, FileRefused, read_regular_file
from distcheck.core.validate import check_type

__all__ = ["MAX_KEY_BYTES", "as_path", "path_text", "read_key_bytes"]

#: the largest answer key read, in bytes (4 MiB; the largest shipped golden key is under 30 KB)
MAX_KEY_BYTES = MAX_INPUT_BYTES


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


def read_key_bytes(p: Path) -> bytes:
    """The bytes of the regular file ``p``, at most MAX_KEY_BYTES, read by the one bounded reader
    (:func:`distcheck.core.files.read_regular_file`: opened without blocking, checked with ``fstat``
    before any read, the read stopped at MAX_KEY_BYTES + 1 bytes). Raises AnswerKeyError naming the file."""
    try:
        return read_regular_file(p, what="an answer key", limit_name="the answer-key limit", limit=MAX_KEY_BYTES)
    except FileRefused as exc:
        reason = exc.reason.replace("cannot be read:", "cannot read the answer key:", 1)
        raise AnswerKeyError(reason, path=str(p)) from None
