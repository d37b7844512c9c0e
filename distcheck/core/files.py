"""Reading input files without trusting the path: regular files only, bounded in size.

:func:`read_regular_file` is the one reader of the files a user names (answer keys,
``pyproject.toml`` / ``--config``): it opens the path without blocking (``open`` on a
named pipe with no writer would wait forever), refuses anything ``fstat`` does not call
a regular file (a pipe, a device such as ``/dev/zero``, a socket, a folder) before
reading a byte, refuses a file over the limit (:data:`MAX_INPUT_BYTES`, 4 MiB, unless
the caller gives another) and reads at most the limit plus one byte, so a file that
grows meanwhile cannot exhaust memory. A refusal is a :class:`FileRefused` whose
``reason`` follows the path (``is a named pipe; an answer key must be a regular file``);
callers turn it into their own typed error naming the file.

The matching rule for a path a command will write is
:func:`distcheck.core.outputs.check_output_target`.
"""

from __future__ import annotations

import os
import stat

__all__ = ["MAX_INPUT_BYTES", "FileRefused", "read_regular_file", "file_kind"]

#: the largest input file read, in bytes (4 MiB; the largest shipped golden key is under 30 KB)
MAX_INPUT_BYTES = 4 * 2**20

_FILE_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"))


class FileRefused(Exception):
    """A file that is not read (or not written): ``path`` and ``reason`` (worded to follow the path)."""

    def __init__(self, path: str, reason: str):
        self.path, self.reason = path, reason
        super().__init__(f"{path}: {reason}")


def file_kind(mode: int) -> str:
    """What a ``st_mode`` names, in words: ``"a named pipe"``, ``"a folder"``, ... (``"a regular file"``)."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((name for test, name in _FILE_KINDS if test(mode)), "not a regular file")


def read_regular_file(path: str | os.PathLike, *, what: str, limit_name: str,
                      limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them.

    ``what`` names the file in a refusal (``"an answer key"``, ``"a config file"``) and
    ``limit_name`` its limit (``"the answer-key limit"``). Raises :class:`FileRefused`
    (nothing read, or the read stopped at ``limit + 1`` bytes) for a path that cannot be
    opened (missing, a dangling symbolic link, no permission), that is not a regular
    file, or that holds more than ``limit`` bytes."""
    text = os.fspath(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(text, flags)
    except OSError as exc:
        if os.path.islink(text) and not os.path.exists(text):
            raise FileRefused(str(text), f"is a symbolic link to a missing file ({os.readlink(text)})") from None
        raise FileRefused(str(text), f"cannot be read: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused(str(text), f"is {file_kind(st.st_mode)}; {what} must be a regular file")
        if st.st_size > limit:
            raise FileRefused(str(text), f"is {st.st_size:,} bytes, over {limit_name} of {limit:,} bytes"
                                         f"{' (4 MiB)' if limit == MAX_INPUT_BYTES else ''}")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(limit + 1 - size, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise FileRefused(str(text), f"cannot be read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if size > limit:
        raise FileRefused(str(text), f"holds more than {limit_name} of {limit:,} bytes"
                                     f"{' (4 MiB)' if limit == MAX_INPUT_BYTES else ''}")
    return b"".join(chunks)

