"""What ``/proc`` says about a process (Linux): its state, start time, parent and pid namespace.

The pool uses these facts to tell a live owner of a temporary folder from a dead
one whose pid was reused (:mod:`distcheck.runners.folders`) and to find a rank's
children (:mod:`distcheck.runners.child`). Every function returns an empty or
neutral answer where ``/proc`` cannot be read (another platform, a process that
just exited), never raises.
"""

from __future__ import annotations

import os

__all__ = ["children", "pid_namespace", "proc_start_time", "proc_stat"]


def proc_stat(pid: int) -> list[str]:
    """Fields of ``/proc/<pid>/stat`` after the command name (state first); [] where unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def proc_start_time(pid: int) -> str | None:
    """Field 22 of ``/proc/<pid>/stat`` (start time in clock ticks), or None where unreadable."""
    fields = proc_stat(pid)
    return fields[19] if len(fields) > 19 else None


def pid_namespace() -> str:
    """This process's pid namespace (``/proc/self/ns/pid``), or ``"-"`` where unreadable."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return "-"


def children(pid: int) -> list[int]:
    """Process ids whose parent is ``pid`` (from ``/proc``; zombies included); [] where unreadable."""
    kids: list[int] = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return kids
    for name in names:
        if name.isdigit():
            fields = proc_stat(int(name))
            if len(fields) > 1 and fields[1] == str(pid):
                kids.append(int(name))
    return kids
