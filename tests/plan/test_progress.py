"""The progress bar: shown on a terminal after its delay, silent off a terminal and with quiet, gone when done."""

from __future__ import annotations

import io
import time

from rich.console import Console

from distcheck.progress import Progress


def _console(terminal: bool) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=terminal, width=100), buf


def test_a_terminal_sees_the_bar_and_it_is_removed_at_the_end():
    console, buf = _console(True)
    with Progress("sizing layouts", total=4, console=console, delay_s=0) as bar:
        assert bar.showing
        for _ in range(4):
            bar.advance()
        bar.update(description="sizing layouts: done")
        time.sleep(0.15)  # one refresh (rich redraws 10 times a second)
    assert not bar.showing
    out = buf.getvalue()
    assert "sizing layouts" in out and "4/4" in out


def test_quick_work_shows_nothing_before_the_delay():
    console, buf = _console(True)
    with Progress("quick", total=1, console=console, delay_s=2.0) as bar:
        bar.advance()
        assert not bar.showing
    assert buf.getvalue() == ""


def test_no_terminal_or_quiet_prints_nothing():
    for terminal, quiet in ((False, False), (True, True)):
        console, buf = _console(terminal)
        with Progress("work", total=2, console=console, quiet=quiet, delay_s=0) as bar:
            bar.advance(2)
            assert not bar.enabled and not bar.showing
        assert buf.getvalue() == ""
