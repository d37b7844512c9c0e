"""Text that is safe to show: control characters made visible, huge numbers shortened.

:func:`clean` is applied where text from input files (an answer key's title, a claim's id, a
detail line) reaches a terminal or an HTML page: every C0 control character but tab and newline,
DEL and every C1 control character (U+0080..U+009F) becomes its Python escape (``ESC [2J`` shows
as ``\\x1b[2J``), so no input can clear a screen, move the cursor or hide text. :func:`shorten`
is applied to the one line of an error message: a run of more than :data:`MAX_DIGITS` digits (a
5,000-digit value echoed back) is shown by its first and last digits and its length, so the line
stays short.
"""

from __future__ import annotations

import re

__all__ = ["clean", "shorten", "MAX_DIGITS", "for_terminal"]

#: the longest run of digits shown whole in an error message
MAX_DIGITS = 40
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_DIGITS = re.compile(r"[0-9]{" + str(MAX_DIGITS + 1) + ",}")


def clean(text: str) -> str:
    """``text`` with its control characters (but tab and newline) written as escapes (``\\x1b``)."""
    return _CONTROL.sub(lambda m: repr(m[0])[1:-1], text)


def shorten(text: str) -> str:
    """``text`` with each run of more than :data:`MAX_DIGITS` digits written as
    ``9999999999...9999 (5,000 digits)``."""
    return _DIGITS.sub(lambda m: f"{m[0][:10]}...{m[0][-4:]} ({len(m[0]):,} digits)", text)


def for_terminal(text: str) -> str:
    """:func:`clean` then :func:`shorten`: the form of an error line printed to a terminal."""
    return shorten(clean(text))
