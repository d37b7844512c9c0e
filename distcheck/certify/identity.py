"""Which code a certificate certified: the target's source file, a sha256, the git commit and the dirty flag.

:func:`code_identity` finds the module that defines the target (a class's or function's
``__module__``, an instance's class's; else the module of its ``module:object`` name) and its file,
then hashes:

* the module file itself (``hashed = "module"``), for code of a checkout, an editable install or a
  script folder;
* the ``RECORD`` file of the installed distribution that lists the module file (``hashed =
  "RECORD"``): the wheel's own list of every installed file with its sha256 (PEP 376 / PEP 627),
  so one digest identifies the whole installed distribution (torch's ``ColwiseParallel``).

When the module file (hashed itself, not through a RECORD) sits in a git work tree, ``git rev-parse
HEAD`` gives the commit and ``git status --porcelain --untracked-files=no`` the dirty flag: True when
a tracked file differs from the commit, or when the module file itself is not tracked (the commit
does not hold it). git runs with a timeout; its absence, a failure or a timeout leave the commit
and the flag None. The version of the distribution is the certification's own
``distribution``/``version`` (:func:`distcheck.engine.contracts.targets.package_version`).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CodeIdentity", "code_identity", "sha256_file", "git_state", "GIT_TIMEOUT_S"]

#: seconds each git command may take before the commit is recorded as unknown
GIT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class CodeIdentity:
    """The code a certification ran.

    Attributes:
        source_file: absolute path of the module file that defines the target (None when it has
            none: a built-in, an object of an interactive session).
        sha256: hex sha256 of ``hashed_file``'s bytes (None with no source file).
        hashed: ``"module"`` (the module file) or ``"RECORD"`` (the installed distribution's RECORD).
        hashed_file: the file hashed.
        git_commit: the 40-hex commit of the git checkout holding ``source_file`` (None outside one,
            or when git is missing or fails).
        git_dirty: True when that checkout has uncommitted changes to tracked files or does not track
            ``source_file``; None when ``git_commit`` is None.
    """

    source_file: str | None = None
    sha256: str | None = None
    hashed: str | None = None
    hashed_file: str | None = None
    git_commit: str | None = None
    git_dirty: bool | None = None

    def describe(self) -> str:
        """One line: the file, the digest and what was hashed, the commit and whether it is dirty."""
        if self.source_file is None:
            return "source: unknown (the target has no module file)"
        what = "the module file" if self.hashed == "module" else f"the distribution's RECORD, {self.hashed_file}"
        text = f"source {self.source_file}, sha256 {self.sha256} ({what})"
        if self.git_commit is not None:
            text += f", git commit {self.git_commit}" + (" (dirty: uncommitted changes)" if self.git_dirty else "")
        return text


def sha256_file(path: str | Path) -> str:
    """The hex sha256 of the file's bytes. Raises OSError when it cannot be read."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _git(folder: Path, *args: str) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):  # no git, not executable, timed out
        return None


def git_state(path: str | Path) -> tuple[str | None, bool | None]:
    """``(commit, dirty)`` of the git work tree holding ``path``, or ``(None, None)`` outside one, without
    git, or when a git command fails or takes more than :data:`GIT_TIMEOUT_S` seconds."""
    file = Path(path)
    folder = file.parent
    head = _git(folder, "rev-parse", "HEAD")
    if head is None or head.returncode != 0:
        return None, None
    commit = head.stdout.strip()
    status = _git(folder, "status", "--porcelain", "--untracked-files=no")
    tracked = _git(folder, "ls-files", "--error-unmatch", "--", file.name)
    if status is None or status.returncode != 0 or tracked is None:
        return commit, None
    return commit, bool(status.stdout.strip()) or tracked.returncode != 0


def _defining_module(obj: Any, ref: str | None) -> str | None:
    """The module that defines ``obj`` (an instance's class's); for a plain container, the module of ``ref``."""
    while isinstance(obj, functools.partial):
        obj = obj.func
    name = None if isinstance(obj, (dict, list, tuple)) else getattr(obj, "__module__", None)
    if isinstance(name, str) and name != "builtins":
        return name
    if ref and ref.count(":") == 1:
        return ref.split(":")[0]
    return None


def _record_of(file: Path, module: str) -> Path | None:
    """The RECORD of the installed distribution that lists ``file`` (found from ``module``'s top-level
    package), or None: no distribution provides it, or the file lies outside it (an editable install)."""
    from distcheck.engine.contracts.targets import package_version

    dist_name, _ = package_version(module)
    if dist_name is None:
        return None
    try:
        dist = importlib.metadata.distribution(dist_name)
        files = list(dist.files or [])
        base = Path(str(dist.locate_file(""))).resolve()
    except Exception:  # noqa: BLE001 - broken metadata: the module file is hashed instead
        return None
    try:
        rel = file.relative_to(base).as_posix()
    except ValueError:  # outside the distribution's folder: an editable install, a checkout
        return None
    if not any(f.as_posix() == rel for f in files):
        return None
    record = next((f for f in files if f.name == "RECORD" and f.parent.name.endswith(".dist-info")), None)
    return None if record is None else Path(str(record.locate()))


def code_identity(obj: Any, ref: str | None = None) -> CodeIdentity:
    """The :class:`CodeIdentity` of the object certified (``ref``: its ``module:object`` name, if any).

    Never raises for a target it cannot place: the fields it cannot find stay None.
    """
    module = _defining_module(obj, ref)
    mod = sys.modules.get(module) if module else None
    path = getattr(mod, "__file__", None) if mod is not None else None
    if not path or not Path(path).is_file():
        return CodeIdentity()
    file = Path(path).resolve()
    record = _record_of(file, module or "")
    hashed_file = record if record is not None and record.is_file() else file
    try:
        digest = sha256_file(hashed_file)
    except OSError:
        return CodeIdentity(source_file=str(file))
    # an installed distribution is identified by its RECORD (a checkout's git state would say nothing of it)
    commit, dirty = git_state(file) if hashed_file == file else (None, None)
    return CodeIdentity(source_file=str(file), sha256=digest, hashed="RECORD" if hashed_file != file else "module",
                        hashed_file=str(hashed_file), git_commit=commit, git_dirty=dirty)
