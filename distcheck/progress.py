"""A progress bar for long runs (rich.progress), shown only where someone is watching.

:class:`Progress` shows a rich progress bar on the console's terminal once the
work has run for ``delay_s`` seconds (default 2), so quick commands print
nothing extra. It stays silent when the console is not a terminal (a pipe, a CI
log, a test) and when ``quiet`` is set. The bar is transient: it disappears
when the work ends, leaving the command's output as it would be without it.

    with Progress("sizing layouts", total=len(layouts), quiet=args.quiet) as bar:
        for lay in layouts:
            ...
            bar.advance()
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.progress import Progress as RichProgress
    from rich.progress import TaskID

__all__ = ["Progress", "DELAY_S"]

#: seconds of work before the bar appears
DELAY_S = 2.0


class Progress:
    """A delayed, transient rich progress bar; a no-op off a terminal or when ``quiet``.

    Args:
        description: what is running (shown left of the bar).
        total: steps in all, or None for an indeterminate bar.
        quiet: never show anything.
        console: a ``rich.console.Console`` (default: one on stderr).
        delay_s: seconds before the bar appears (>= 0).

    Use as a context manager; :meth:`advance` and :meth:`update` may be called
    whether or not the bar is showing.
    """

    def __init__(self, description: str, total: int | None = None, *, quiet: bool = False, console: Any = None,
                 delay_s: float = DELAY_S):
        from rich.console import Console

        self.console = console if console is not None else Console(stderr=True)
        self.enabled = not quiet and self.console.is_terminal
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._started = self._closed = False
        self._bar: RichProgress | None = None
        self._task: TaskID | None = None
        self.delay_s = delay_s
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                     MofNCompleteColumn(), TimeElapsedColumn(), console=self.console, transient=True)
            self._task = self._bar.add_task(description, total=total)

    @property
    def showing(self) -> bool:
        """True while the bar is on screen."""
        return self._started and not self._closed

    def _start(self) -> None:
        with self._lock:
            if self._bar is not None and not self._closed and not self._started:
                self._bar.start()
                self._started = True

    def __enter__(self) -> Progress:
        if self.enabled:
            if self.delay_s <= 0:
                self._start()
            else:
                self._timer = threading.Timer(self.delay_s, self._start)
                self._timer.daemon = True
                self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Remove the bar (idempotent)."""
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:
            if self._bar is not None and self._started and not self._closed:
                self._bar.stop()
            self._closed = True

    def advance(self, steps: int = 1) -> None:
        if self._bar is not None and self._task is not None:  # enabled
            self._bar.advance(self._task, steps)

    def update(self, *, description: str | None = None, completed: int | None = None, total: int | None = None) -> None:
        if self._bar is not None and self._task is not None:  # enabled
            # rich leaves a field as it is when its argument is None
            self._bar.update(self._task, description=description, completed=completed, total=total)
