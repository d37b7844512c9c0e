"""A set of output files as one unit: staged beside the target, swapped in with renames.

A report (``DIR/report.html``, ``DIR/report.md``, its PNG figures) or a certificate pair
(``cert.json`` and ``cert.md``) is read as a set: a reader must find the complete old set or
the complete new one, never a new Markdown beside an old HTML. Writing each file atomically
does not give that; this module does:

* :func:`write_folder` writes every file of a report into a staging folder beside ``DIR``
  (``.<DIR name>.distcheck-stage.<pid>.<random>``), fsyncs them, and swaps it with ``DIR`` in
  one ``renameat2(RENAME_EXCHANGE)`` (Linux 3.15+, glibc 2.28+): one system call, so no
  signal, not even SIGKILL, can leave a mixed folder. Without it (another system), ``DIR`` is
  renamed aside and the staging folder renamed in: a kill between the two leaves ``DIR``
  missing for that instant, and the next run puts the old set back (:func:`sweep`). Regular
  files in ``DIR`` that are not the report's are carried over (hard links, else copies).
* :func:`write_files` writes a set of files (folders may differ) into a staging folder in each
  target's folder, marks every staging folder committed, then renames each file into place
  with SIGINT and SIGTERM held, so neither signal can split the set. A SIGKILL between two of
  those renames (a few microseconds) leaves the set mixed until the next run of ours, which
  finishes the committed renames (roll forward) before it does anything else.
* :func:`sweep` removes the staging folders that a killed run of ours left in a folder, and
  only those: the name carries our prefix and the PID of the run, and a folder whose process
  is alive (another run at work) is never touched.
* :func:`check_output_target` is the one rule, for every command, for a path a command will
  write: refused before the work starts (a :class:`~distcheck.core.errors.ConfigError`
  naming the flag: exit 2) when it is a symbolic link, a named pipe, a device or a socket, a
  folder where a file is expected (or a file where a folder is), read-only, or in a folder
  that does not exist or is read-only. It also sweeps the target's folder (:func:`sweep`), so
  a run clears the leftovers of killed runs when it starts.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import secrets
import shutil
import stat
from collections.abc import Callable, Mapping
from pathlib import Path

from distcheck.core.atomic import _signals_held
from distcheck.core.errors import ConfigError
from distcheck.core.files import file_kind

__all__ = ["STAGE_TAG", "sweep", "write_folder", "write_files", "check_output_target", "staging_leftovers"]

#: the tag in every staging folder's name: ``.<target name>.distcheck-stage.<pid>.<12 hex digits>``
STAGE_TAG = "distcheck-stage"
_STAGE = re.compile(r"^\.(?P<name>.+)\." + STAGE_TAG + r"\.(?P<pid>[0-9]+)\.[0-9a-f]{12}(?P<old>\.old)?$")
_COMMITTED = ".committed"
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    except OverflowError:
        return False
    return True


def staging_leftovers(folder: str | os.PathLike) -> list[Path]:
    """The staging folders of ours in ``folder`` (any PID, alive or not), sorted by name."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return sorted(Path(folder) / n for n in names if _STAGE.match(n))


def sweep(folder: str | os.PathLike) -> list[Path]:
    """Clean up after killed runs of ours in ``folder``; return the staging folders handled.

    A staging folder whose PID is alive is left alone. Of the others: a committed file set
    (:func:`write_files`) is finished first (its files renamed into place), a report folder
    renamed aside whose target is missing (the fallback swap, killed half-way) is put back,
    and every other leftover is removed."""
    done = []
    for stage in staging_leftovers(folder):
        m = _STAGE.match(stage.name)
        assert m is not None  # staging_leftovers matched it
        if _alive(int(m["pid"])) or stage.is_symlink() or not stage.is_dir():
            continue
        target = stage.parent / m["name"]
        with contextlib.suppress(OSError):
            if m["old"] and not os.path.lexists(target):
                os.rename(stage, target)
                done.append(stage)
                continue
            if (stage / _COMMITTED).is_file():
                for name in os.listdir(stage):
                    if name != _COMMITTED:
                        os.replace(stage / name, stage.parent / name)
            shutil.rmtree(stage)
            done.append(stage)
    return done


def _stage_name(folder: Path, name: str, suffix: str = "") -> Path:
    return folder / f".{name}.{STAGE_TAG}.{os.getpid()}.{secrets.token_hex(6)}{suffix}"


def _write(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _exchange(a: Path, b: Path) -> bool:
    """Swap ``a`` and ``b`` in one system call; False where the system has no such call."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (22, 38, 95):  # EINVAL (file system without it), ENOSYS, EOPNOTSUPP
        return False
    raise OSError(err, os.strerror(err), str(b))


def write_folder(directory: str | os.PathLike, files: Mapping[str, bytes], *,
                 ours: Callable[[str], bool] = lambda name: False) -> Path:
    """Make ``directory`` hold ``files`` (name to bytes) as one unit (see the module docstring).

    An existing ``directory`` is replaced whole: its entries for which ``ours(name)`` is true
    (the old report's files) go, its other regular files are carried over. Its parent folder must
    exist. Raises OSError when a write fails (the old set stays, the staging folder is removed)."""
    target = Path(os.path.abspath(directory))
    parent = target.parent
    sweep(parent)
    stage = _stage_name(parent, target.name)
    os.mkdir(stage)
    try:
        for name, data in files.items():
            _write(stage / name, data)
        if target.is_dir():
            for name in os.listdir(target):
                src = target / name
                if name in files or ours(name) or not src.is_file() or src.is_symlink():
                    continue
                try:
                    os.link(src, stage / name)
                except OSError:
                    shutil.copy2(src, stage / name)
        _fsync_dir(stage)
        if not target.exists():
            os.rename(stage, target)
        elif not _exchange(stage, target):
            aside = _stage_name(parent, target.name, ".old")
            os.rename(target, aside)
            os.rename(stage, target)
            stage = aside
        _fsync_dir(parent)
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(stage)
    return target


def write_files(files: Mapping[str | os.PathLike, bytes]) -> list[Path]:
    """Replace every file of ``files`` (path to bytes) as one set (see the module docstring).

    Each folder must exist. Raises OSError when a write fails before the renames (every old file
    stays, the staging folders are removed)."""
    targets = [Path(os.path.abspath(p)) for p in files]
    folders = list(dict.fromkeys(t.parent for t in targets))
    stages: dict[Path, Path] = {}
    try:
        for folder in folders:
            sweep(folder)
            first = next(t.name for t in targets if t.parent == folder)
            stages[folder] = _stage_name(folder, first)
            os.mkdir(stages[folder])
        for t, data in zip(targets, files.values(), strict=True):
            _write(stages[t.parent] / t.name, data)
        for stage in stages.values():
            _write(stage / _COMMITTED, b"")
            _fsync_dir(stage)
        with _signals_held():
            for t in targets:
                os.replace(stages[t.parent] / t.name, t)
        for folder in folders:
            _fsync_dir(folder)
    finally:
        for stage in stages.values():
            with contextlib.suppress(OSError):
                shutil.rmtree(stage)
    return targets


def _refuse(flag: str, path: str, rule: str) -> ConfigError:
    return ConfigError(flag, path, rule)


def _read_only(path: Path, st: os.stat_result) -> bool:
    return not os.access(path, os.W_OK) or not st.st_mode & 0o222


def check_output_target(flag: str, path: str | os.PathLike, *, folder: bool = False) -> Path:
    """``path`` as a Path if the command may write there (a file, or with ``folder=True`` a report
    folder); else ConfigError(``flag``, path, rule), before any work.

    Refused: a symbolic link (the write would replace the link, or write through it), a named pipe,
    a device, a socket, a folder where a file is expected or a file where a folder is, a target
    that is read-only (no write permission bit, or no write access), a parent folder that does not
    exist or is read-only (the new file or the staging folder is made there), and a report folder
    that is the current folder or holds it, or holds a sub-folder (a report folder is replaced whole)."""
    text = os.fspath(path)
    p = Path(text)
    try:
        st: os.stat_result | None = os.lstat(p)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise _refuse(flag, text, f"cannot be checked: {exc.strerror or exc}") from None
    want = "a folder or a new path" if folder else "a regular file or a new path"
    if st is not None:
        kind_ok = stat.S_ISDIR(st.st_mode) if folder else stat.S_ISREG(st.st_mode)
        if not kind_ok:
            kind = "a file" if stat.S_ISREG(st.st_mode) else file_kind(st.st_mode)
            raise _refuse(flag, text, f"is {kind}; it must be {want}")
        if _read_only(p, st):
            raise _refuse(flag, text, f"is read-only; it must be {want} that can be replaced")
        if folder:
            _check_report_contents(flag, text, p)
    parent = Path(os.path.dirname(os.path.abspath(p)))
    if not parent.is_dir():
        raise _refuse(flag, text, f"names a folder that does not exist ({parent})")
    if _read_only(parent, os.stat(parent)):
        raise _refuse(flag, text, f"is in a read-only folder ({parent})")
    sweep(parent)  # the run starts: the leftovers of killed runs of ours go
    return p


def _check_report_contents(flag: str, text: str, p: Path) -> None:
    here, real = os.path.realpath(os.getcwd()), os.path.realpath(p)
    if here == real or here.startswith(real.rstrip(os.sep) + os.sep):
        raise _refuse(flag, text, "is the current folder or holds it; a report folder is replaced whole: "
                                  "give a folder of its own")
    try:
        entries = list(os.scandir(p))
    except OSError as exc:
        raise _refuse(flag, text, f"cannot be listed: {exc.strerror or exc}") from None
    for e in entries:
        if not e.is_file(follow_symlinks=False):
            raise _refuse(flag, text, f"holds {e.name!r}, not a regular file; a report folder is replaced "
                                      "whole: give a folder of its own")
