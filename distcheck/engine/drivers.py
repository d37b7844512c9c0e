"""Helpers of the real-backend check drivers: run a rank function on a world without letting a
failure escape, and turn what came back into report rows.

A *world* is anything with ``run(fn, *args)`` (every rank's result, in rank order),
``world_size`` and ``backend``: a :class:`~distcheck.runners.pool.RankPool`, a
:class:`~distcheck.runners.torchrun_world.TorchrunWorld`, a threaded pool. Drivers receive a
world and never start one (the stages of ``distcheck check`` own the worlds).

A failed world step becomes one line (:func:`describe_failure`): the first failing rank's own
exception line, never the pool's trailing notes, at most :data:`FAILURE_DETAIL_CHARS`
characters, with the exception type kept when the message is cut.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from distcheck.core.errors import DistributedError, RankFailure
from distcheck.core.results import FAIL, PASS, SKIP, CheckResult
from distcheck.engine.world import World

__all__ = ["FAILURE_DETAIL_CHARS", "is_world", "result_row", "skip_row", "exception_line", "describe_failure",
           "run_guarded"]

#: the longest detail :func:`describe_failure` returns, in characters
FAILURE_DETAIL_CHARS = 400

_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Failure|Timeout|Warning|Unavailable))(:.*)?$")


def is_world(obj: object) -> bool:
    """True for a started or unstarted world object: ``.run``, ``.world_size`` and ``.backend``."""
    return callable(getattr(obj, "run", None)) and hasattr(obj, "world_size") and hasattr(obj, "backend")


def result_row(check: str, backend: str, world_size: int, examples: int, ok: bool, *,
               max_error: float | None = None, bound: float | None = None, detail: str = "",
               extra: dict | None = None) -> CheckResult:
    """A pass/FAIL :class:`~distcheck.core.results.CheckResult` row."""
    return CheckResult(check=check, backend=backend, verdict=PASS if ok else FAIL, world_size=world_size,
                       examples=examples, max_error=max_error, bound=bound, detail=detail, extra=extra or {})


def skip_row(check: str, backend: str, world_size: int, reason: str) -> CheckResult:
    """A ``skip`` row carrying the reason."""
    return CheckResult(check=check, backend=backend, verdict=SKIP, world_size=world_size, examples=0, detail=reason)


def exception_line(text: str) -> str:
    """The ``Type: message`` line of a traceback text; the first line when there is none.

    A Python traceback ends with the exception line; with a multi-line message
    the last line is only the message's tail, so the last line at column 0 that
    starts with an exception type name (``...Error``, ``...Exception``,
    ``KeyboardInterrupt``, ``SystemExit``, ...) is taken. A rank that died
    without a Python exception has no such line; its text starts with how it
    ended (``rank 1 was killed by SIGSEGV ...``), so the first non-empty line is
    returned then. An exception line with an empty message (``RuntimeError:``, its
    message starting on the next line, as torch's pipeline stages raise) takes the
    message's first two lines, and, when the traceback chains an exception it was
    raised from, that exception's line.
    """
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    found = [i for i, ln in enumerate(lines) if _EXC_LINE.match(ln)]
    if not found:
        return lines[0].strip() if lines else ""
    i = found[-1]
    line = lines[i]
    if line.endswith(":"):  # a message that starts on the next line (torch's pipeline stages raise those)
        tail = [ln.strip() for ln in lines[i + 1:i + 3] if not _EXC_LINE.match(ln)]
        line = " ".join([line, *tail])
        # and the exception it was raised from, when the traceback chains one: its line carries the reason
        if len(found) > 1 and "The above exception was the direct cause" in text:
            line += f" (raised from {lines[found[-2]]})"
    return line


_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+)')


def exception_origin(text: str) -> str:
    """A crash's origin, as Hypothesis tells failures apart: the exception type and the innermost frame
    (``"AssertionError at layer.py:307"``); the exception line alone when the text has no frame."""
    kind = exception_line(text).split(":", 1)[0]
    frames = [m for m in map(_FRAME.match, text.splitlines()) if m]
    if not frames:
        return kind
    path, line = frames[-1].groups()
    return f"{kind} at {path.rsplit('/', 1)[-1]}:{line}"


def describe_failure(exc: BaseException, limit: int = FAILURE_DETAIL_CHARS) -> str:
    """A one-line detail for a failed world step, at most ``limit`` characters.

    * :class:`~distcheck.core.errors.RankFailure`: ``RankFailure: rank r failed:
      <Type: message of rank r>`` for the first failing rank ``r`` (its own
      traceback's exception line, never the pool's trailing notes), then
      ``(also failed: ranks [...])`` when others failed too. When the line is
      too long the *other ranks* note goes first, then the message is cut, so
      the exception type always survives.
    * any other error: ``Type: first line`` (a ``WorldTimeout``'s first line
      names the timeout and the stuck ranks).
    """
    name = type(exc).__name__
    if isinstance(exc, RankFailure):
        failures = getattr(exc, "failures", None) or {exc.rank: exc.traceback_text}
        line = exception_line(failures.get(exc.rank, exc.traceback_text))
        head = f"{name}: rank {exc.rank} failed: "
        others = sorted(set(failures) - {exc.rank})
        note = f" (also failed: ranks {others})" if others else ""
        if len(head) + len(line) + len(note) > limit:
            note = ""
        text = head + line + note
    else:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        text = f"{name}: {lines[0] if lines else ''}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def run_guarded(world: World, fn: Callable[..., Any], *args: Any) -> tuple[list[Any] | None, str | None]:
    """``world.run(fn, *args)``; a failing world becomes ``(None, describe_failure(error))``."""
    try:
        return world.run(fn, *args), None
    except DistributedError as exc:
        return None, describe_failure(exc)
