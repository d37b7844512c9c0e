"""Write a file whole or not at all: a temporary file beside it, then a rename.

:func:`write_text_atomic` writes to a new temporary file in the target's folder
(``.<name>.<random>.tmp``, created with ``O_EXCL`` and mode 0o666 less the umask,
as ``open`` would), flushes and fsyncs it, and renames it over the target with
:func:`os.replace`, which is atomic within one file system on POSIX and Windows.
A reader sees the old file or the new one, never a half-written one. A symbolic
link is followed (the file it names is replaced, the link kept); an existing
target that is not a regular file (a named pipe, a device such as /dev/stdout's
terminal, a socket) is refused rather than replaced by a file.

The temporary file is removed on every exit path Python sees: an exception, a
``KeyboardInterrupt`` (SIGINT), or SIGTERM where the process turns it into an
exception (the ``distcheck`` command line does). SIGINT and SIGTERM are held off
(``signal.pthread_sigmask``, main thread, POSIX) while the temporary file is
created, so no signal can land between its creation and the clean-up that
guards it. A process killed outright (SIGKILL, power loss) may leave the
temporary file behind; the target is still never half-written.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import secrets
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

from distcheck.core.errors import ConfigError

__all__ = ["write_text_atomic"]

_HELD = tuple(s for s in (getattr(signal, "SIGINT", None), getattr(signal, "SIGTERM", None)) if s is not None)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM until the block ends (a no-op off the main thread or without
    ``pthread_sigmask``); a signal that arrived meanwhile is handled right after."""
    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _create_beside(target: Path) -> tuple[int, Path]:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {target}")  # pragma: no cover - 2**48 names


def write_text_atomic(path: str | os.PathLike[str], text: str, *, encoding: str = "utf-8") -> None:
    """Replace the file at ``path`` with ``text`` atomically (see the module docstring).

    Args:
        path: the file to write; its folder must exist. An existing file is replaced.
        text: the whole content.
        encoding: text encoding (default UTF-8).

    Raises:
        ConfigError: ``path`` is not a str or os.PathLike, names an existing file that is not a
            regular file (pipe, device, socket), or ``text`` is not a str.
        LookupError: ``encoding`` is unknown (nothing is created).
        OSError: the folder is missing or not writable, the disk is full, ``path`` is a folder.
            The temporary file is removed before any exception (KeyboardInterrupt included)
            propagates.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise ConfigError("path", path, "must be a file path (str or os.PathLike)")
    if not isinstance(text, str):
        raise ConfigError("text", type(text).__name__, "must be a str")
    codecs.lookup(encoding)  # LookupError for an unknown encoding, before anything is created
    target = Path(os.path.realpath(path))
    if target.exists() and not (target.is_file() or target.is_dir()):  # a folder fails in os.replace
        raise ConfigError("path", os.fspath(path), "is not a regular file (a pipe, device or socket is never replaced)")
    tmp: Path | None = None
    try:
        with _signals_held():
            fd, tmp = _create_beside(target)
            out = os.fdopen(fd, "w", encoding=encoding)  # on failure open() closes fd itself
        with out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
        tmp = None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
