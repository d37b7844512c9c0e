"""The ranks' warnings: caught where they are raised, sent to the parent, summarised once.

A rank's Python warnings (``warnings.warn``) and its libraries' logged warnings (torch's
``[rank0]:W... _redistribute.py:...`` lines: a ``logging`` record at level WARNING) would reach the
user's stderr in the middle of the progress lines, once per rank and per step. Instead:

* in every rank (a process rank, or the threaded host of every rank), :func:`catch_in_rank` replaces
  ``warnings.showwarning`` and makes every logging handler that writes to a stream other than a file
  (stderr, or what stood for it when the handler was made) hand its WARNING records to a collector
  instead, each record once however many handlers it meets (records of level ERROR and above, and those
  below WARNING that a user asked for, still go to stderr); the warnings filters are left alone, so
  under ``python -W error`` (or a ``warnings.simplefilter("error")`` in the parent before it starts the
  pool) a rank's warning still raises, and fails its step;
* the rank sends what it caught to the parent (:func:`drain`, a ``("warned", [...])`` message of
  :mod:`~distcheck.runners.protocol` just before its answer);
* the parent keeps them (:func:`record`) until a report takes them (:func:`take`) and prints them
  once, after the table (:func:`summary_lines`): ``torch warned 4 times (ranks 0, 1): ...``, one
  line per distinct warning with its count.
"""

from __future__ import annotations

import logging
import sys
import threading
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["RankWarning", "catch_in_rank", "drain", "record", "take", "summary_lines"]


@dataclass(frozen=True)
class RankWarning:
    """One warning a rank raised.

    Attributes:
        rank: the rank that raised it.
        source: the top-level package that warned (``"torch"``), from the logger's name or the file.
        kind: the warning's category (``"UserWarning"``) or ``"logged WARNING"``.
        where: ``path:line`` of the line that warned, the path relative to its ``sys.path`` entry
            (``torch/distributed/tensor/_redistribute.py:390``).
        message: the warning's first line.
    """

    rank: int
    source: str
    kind: str
    where: str
    message: str


def _relative(path: str) -> str:
    """``path`` relative to the longest ``sys.path`` entry that holds it (else as given)."""
    best = ""
    for entry in sys.path:
        if entry and path.startswith(entry.rstrip("/") + "/") and len(entry) > len(best):
            best = entry.rstrip("/")
    return path[len(best) + 1:] if best else path


def _source(name: str) -> str:
    return name.split(".")[0].split("/")[0].removesuffix(".py") or "python"


class _Collector:
    """What one rank process caught (thread-safe: the threaded host's ranks are threads)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.items: list[RankWarning] = []
        self.lock = threading.Lock()

    def rank_now(self) -> int:
        name = threading.current_thread().name  # a threaded host's rank threads are "rank-N"
        return int(name[5:]) if name.startswith("rank-") and name[5:].isdigit() else self.rank

    def add(self, source: str, kind: str, where: str, message: str) -> None:
        first = (message.splitlines() or [""])[0]
        with self.lock:
            self.items.append(RankWarning(self.rank_now(), source, kind, where, first))

    def showwarning(self, message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None,
                    line: str | None = None) -> None:
        where = _relative(filename)
        self.add(_source(where), category.__name__, f"{where}:{lineno}", str(message))


class _Divert(logging.Filter):
    """On a handler that writes to a stream: WARNING records go to the collector, not to the stream."""

    def __init__(self, collector: _Collector) -> None:
        super().__init__()
        self.collector = collector

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING:
            return True
        if getattr(record, "distcheck_caught", False):  # met on another handler already
            return False
        record.distcheck_caught = True
        where = _relative(record.pathname)
        self.collector.add(_source(record.name), "logged WARNING", f"{where}:{record.lineno}", record.getMessage())
        return False


_collector: _Collector | None = None


def _stderr_handlers() -> Iterable[logging.Handler]:
    loggers = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger)]
    for lg in loggers:
        for h in lg.handlers:
            # every stream but a file: the stream may be a stand-in for stderr (a test runner's capture) that was
            # sys.stderr when the library made its handler
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
                yield h
    if logging.lastResort is not None:  # a record no handler took: Python's last resort writes it to stderr
        yield logging.lastResort


def catch_in_rank(rank: int) -> None:
    """In a rank: catch its warnings from now on (see the module docstring); call again after imports that
    add logging handlers (torch's). The warnings filters are not touched: an ``error`` filter still raises."""
    global _collector
    if _collector is None:
        _collector = _Collector(rank)
    warnings.showwarning = _collector.showwarning
    for h in _stderr_handlers():
        if not any(isinstance(f, _Divert) for f in h.filters):
            h.addFilter(_Divert(_collector))


def drain() -> list[RankWarning]:
    """In a rank: the warnings caught since the last call (and forget them)."""
    if _collector is None:
        return []
    with _collector.lock:
        items, _collector.items = _collector.items, []
    return items


# ----------------------------------------------------------------------------- the parent

_received: list[RankWarning] = []
_received_lock = threading.Lock()


def record(items: Iterable[RankWarning]) -> None:
    """In the parent: keep the warnings a rank sent, until a report takes them."""
    with _received_lock:
        _received.extend(items)


def take() -> list[RankWarning]:
    """In the parent: every warning received since the last call (and forget them)."""
    global _received
    with _received_lock:
        items, _received = _received, []
    return items


def summary_lines(items: Iterable[RankWarning]) -> list[str]:
    """The warnings, once: per source ``torch warned 4 times (ranks 0, 1):``, then one line per distinct
    warning (kind, place, message) with its count. Empty when there is none."""
    by_source: dict[str, dict[tuple[str, str, str], list[int]]] = {}
    for w in items:
        by_source.setdefault(w.source, {}).setdefault((w.kind, w.where, w.message), []).append(w.rank)
    lines = []
    for source, distinct in by_source.items():
        total = sum(len(ranks) for ranks in distinct.values())
        ranks = sorted({r for rs in distinct.values() for r in rs})
        lines.append(f"{source} warned {total} time{'s' if total > 1 else ''} on the ranks "
                     f"(rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}):")
        for (kind, where, message), rs in distinct.items():
            lines.append(f"  {len(rs)}x {where}: {kind}: {message}")
    return lines
