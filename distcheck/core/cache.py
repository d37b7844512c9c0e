"""distcheck's own cache folder, and Hypothesis' storage kept inside it.

Hypothesis keeps files under its storage directory even with no example database: the
constants it collects from the code under test (``.hypothesis/constants``), and its
``.gitignore``. Its default is ``.hypothesis/`` in the *current* folder, so a ``distcheck
check`` run from a user's project would leave that folder behind. :func:`hypothesis_storage`
names the folder a run uses instead, through Hypothesis' documented environment variable
``HYPOTHESIS_STORAGE_DIRECTORY`` (which the processes of a world inherit): a value the user set
is kept; otherwise ``<cache>/hypothesis``, where ``<cache>`` is ``$XDG_CACHE_HOME/distcheck``,
else ``~/.cache/distcheck`` (the XDG Base Directory Specification's default).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["cache_folder", "hypothesis_storage", "HYPOTHESIS_STORAGE_VAR"]

#: the environment variable Hypothesis reads for its storage directory
HYPOTHESIS_STORAGE_VAR = "HYPOTHESIS_STORAGE_DIRECTORY"


def cache_folder() -> Path:
    """``$XDG_CACHE_HOME/distcheck`` (an absolute value only, as the specification says), else
    ``~/.cache/distcheck``; not created here."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".cache"
    return root / "distcheck"


@contextlib.contextmanager
def hypothesis_storage() -> Iterator[str]:
    """Point Hypothesis' storage at ``cache_folder() / "hypothesis"`` for the block (unless the user
    set ``HYPOTHESIS_STORAGE_DIRECTORY``), and yield the folder used; the environment is restored
    after the block. In a process whose Hypothesis has already chosen its folder, that choice stands
    (Hypothesis reads the variable once); the rank processes started in the block read it afresh."""
    given = os.environ.get(HYPOTHESIS_STORAGE_VAR)
    if given:
        yield given
        return
    folder = str(cache_folder() / "hypothesis")
    os.environ[HYPOTHESIS_STORAGE_VAR] = folder
    try:
        yield folder
    finally:
        os.environ.pop(HYPOTHESIS_STORAGE_VAR, None)
