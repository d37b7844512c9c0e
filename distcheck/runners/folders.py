"""A pool's private temporary folder: creation, owner marker, removal once the owner is dead.

Each pool keeps its rendezvous store and faulthandler dumps in a folder
``<tmp>/distcheck-pool-*`` holding an ``owner`` marker: one line
``pid start_time host pid_namespace`` naming the pool's parent (:func:`owner_line`).
The start time (from ``/proc``) makes the marker robust to pid reuse; the host
and pid namespace keep a ``/tmp`` shared between containers safe.

``close()``, garbage collection and interpreter exit remove the folder. A parent
stopped by a signal that runs no Python clean-up (SIGTERM's default action,
SIGKILL) cannot: on Linux its ranks' guards remove it once the parent is dead
(:func:`remove_folder_of_dead_owner`), and as a backstop every pool, when it makes
its own folder, first removes the folders of dead owners in the same temporary
root (:func:`sweep_stale_folders`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

from distcheck.runners.procfs import pid_namespace, proc_start_time, proc_stat

__all__ = ["OWNER_FILE", "TMP_PREFIX", "make_pool_folder", "owner_is_dead", "owner_line",
           "remove_folder_of_dead_owner", "sweep_stale_folders"]

#: prefix of a pool's private temporary folder, and the owner marker file inside it
TMP_PREFIX = "distcheck-pool-"
OWNER_FILE = "owner"


def owner_line(pid: int) -> str:
    """``pid start_time host pid_namespace``: who owns a pool folder, robust to pid reuse."""
    return f"{pid} {proc_start_time(pid) or '-'} {os.uname().nodename} {pid_namespace()}\n"


def owner_is_dead(line: str) -> bool:
    """True only when the marker names a process of this host and pid namespace that is gone.

    Gone means: no such pid, a zombie, or a pid reused by a process that
    started at another time. A marker from another host or pid namespace (a
    shared /tmp between containers) is never judged dead.
    """
    parts = line.split()
    if len(parts) != 4 or not parts[0].isdigit():
        return False
    pid, start, host, ns = int(parts[0]), parts[1], parts[2], parts[3]
    if host != os.uname().nodename or ns != pid_namespace():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # PermissionError included: someone else's live process
        return False
    if proc_stat(pid)[:1] == ["Z"]:
        return True
    now = proc_start_time(pid)
    return start != "-" and now is not None and now != start


def sweep_stale_folders(root: str | None = None) -> list[str]:
    """Remove pool folders under ``root`` whose owner process is dead; return their paths.

    ``root`` defaults to :func:`tempfile.gettempdir` (where pools create their
    folders). A folder qualifies when its name starts with ``distcheck-pool-``,
    it belongs to this user, and its ``owner`` marker (written by the pool that
    made it: pid, process start time, host, pid namespace) names a dead process
    of this host and pid namespace. Folders without a marker (being created
    right now, or made by an older version) are left alone. A pool calls this
    when it makes its own folder, so a parent stopped by a signal that skips
    clean-up (SIGTERM's default action, SIGKILL) leaves its folder only until
    the next pool starts in the same temporary root. Never raises for a folder
    it cannot read or remove.
    """
    root = tempfile.gettempdir() if root is None else root
    removed: list[str] = []
    try:
        names = [n for n in os.listdir(root) if n.startswith(TMP_PREFIX)]
    except OSError:
        return removed
    uid = os.getuid() if hasattr(os, "getuid") else None
    for name in names:
        path = os.path.join(root, name)
        try:
            if uid is not None and os.stat(path).st_uid != uid:
                continue
            with open(os.path.join(path, OWNER_FILE)) as f:
                line = f.read()
        except OSError:
            continue
        if owner_is_dead(line):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def make_pool_folder() -> str:
    """A private folder with its owner marker (this process); first removes dead pools' folders."""
    sweep_stale_folders()
    path = tempfile.mkdtemp(prefix=TMP_PREFIX)
    partial = os.path.join(path, OWNER_FILE + ".partial")
    with open(partial, "w") as f:
        f.write(owner_line(os.getpid()))
    os.replace(partial, os.path.join(path, OWNER_FILE))  # a reader never sees half a marker
    return path


def remove_folder_of_dead_owner(folder: str, wait_s: float) -> bool:
    """Remove ``folder`` if its owner marker names a dead process, waiting up to ``wait_s`` for it to die.

    Returns True when it removed the folder; False when the folder is gone already,
    has no marker, or its owner is still alive at the end of the wait.
    """
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with open(os.path.join(folder, OWNER_FILE)) as f:
                line = f.read()
        except OSError:
            return False  # gone already, or never marked
        if owner_is_dead(line):
            shutil.rmtree(folder, ignore_errors=True)
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
