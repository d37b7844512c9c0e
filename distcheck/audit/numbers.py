"""Numbers as a reader sees them: the value printed and the rounding step it carries.

A decimal point, an exponent or an approximation mark says the figure was rounded
at its last printed digit: ``107.81`` is +-0.005, ``42.9`` is +-0.05, ``6.7e-02``
is +-0.0005, ``~109`` is +-0.5. A whole number written in full without a mark
(``5``, ``1,024``, ``16_384``) is exact (step 0), and so is a ratio (``"3/7"``): a
figure printed as ``4`` is not widened to 3.5..4.5 unless the answer key states
``rounding = 1`` or prints ``~4``. (What a step means for consistency, ties
included, is in :mod:`distcheck.audit.figures`.)

Everything here is exact: values and steps are :class:`fractions.Fraction`.
Nothing is evaluated as code; the text must match one regular expression.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from distcheck.core.errors import ConfigError

__all__ = ["PrintedNumber", "parse_printed", "step_of_literal", "format_exact"]

# optional approximation mark, sign, digits with optional thousands separators
# (',' or '_'), optional decimals, optional exponent
_DECIMAL = re.compile(
    r"""^\s*(?P<approx>~|≈|about\s+)?\s*
        (?P<sign>[+-])?
        (?P<int>\d{1,3}(?:[,_]\d{3})+|\d+)?
        (?:\.(?P<frac>\d*))?
        (?:[eE](?P<exp>[+-]?\d+))?\s*$""",
    re.VERBOSE,
)
_RATIO = re.compile(r"^\s*(?P<sign>[+-])?(?P<num>\d+)\s*/\s*(?P<den>\d+)\s*$")
_MAX_DIGITS = 60  # refuse absurd literals instead of building huge integers


@dataclass(frozen=True)
class PrintedNumber:
    """A printed figure: its exact value and the step of its last printed digit.

    ``step`` is 0 for an exact ratio ("3/7") and for a whole number written in full
    ("1,024"). ``approx`` is True when the text carried a "~"; on a whole number it
    makes the last digit a rounded one ("~109" is +-0.5, "109" is exact).
    """

    value: Fraction
    step: Fraction
    text: str
    approx: bool = False


def parse_printed(text: str) -> PrintedNumber | None:
    """Parse ``text`` as a printed number; return None if it is not one.

    Accepted forms: ``107.81``, ``1,103.61``, ``1_024``, ``~870``, ``6.7e-02``,
    ``.5``, ``3/7`` (an exact ratio). The step is 10**-(decimals) times
    10**exponent when the text has a decimal point, an exponent or a "~"; a whole
    number written in full and a ratio have step 0.
    """
    if not isinstance(text, str) or len(text) > 200:
        return None
    m = _RATIO.match(text)
    if m:
        if len(m["num"]) > _MAX_DIGITS or len(m["den"]) > _MAX_DIGITS or int(m["den"]) == 0:
            return None
        value = Fraction(int(m["num"]), int(m["den"]))
        return PrintedNumber(-value if m["sign"] == "-" else value, Fraction(0), text.strip())
    m = _DECIMAL.match(text)
    if not m:
        return None
    int_part = (m["int"] or "").replace(",", "").replace("_", "")
    frac = m["frac"]
    if not int_part and not frac:
        return None
    if len(int_part) + len(frac or "") > _MAX_DIGITS:
        return None
    exp = int(m["exp"]) if m["exp"] is not None else 0
    if abs(exp) > 400:
        return None
    digits = int((int_part or "0") + (frac or ""))
    decimals = len(frac or "")
    value = Fraction(digits, 10**decimals) * Fraction(10) ** exp
    rounded = frac is not None or m["exp"] is not None or bool(m["approx"])
    step = Fraction(1, 10**decimals) * Fraction(10) ** exp if rounded else Fraction(0)
    if m["sign"] == "-":
        value = -value
    return PrintedNumber(value, step, text.strip(), approx=bool(m["approx"]))


def step_of_literal(text: str) -> Fraction | None:
    """The rounding step a TOML number literal implies (None if it is not one)."""
    p = parse_printed(text)
    return None if p is None else p.step


def format_exact(value: Fraction | int, digits: int = 6) -> str:
    """Format an exact value for a report: integers in full, others as a decimal
    with ``digits`` significant digits and, when the denominator is small, the
    exact ratio too (e.g. ``0.428571 (3/7)``). Raises ConfigError for a value that is not an
    int or Fraction (a bool included) or ``digits`` that is not an integer from 1 to 60."""
    if isinstance(value, bool) or not isinstance(value, (int, Fraction)):
        raise ConfigError("value", value, "must be an int or a Fraction")
    if isinstance(digits, bool) or not isinstance(digits, int) or not 1 <= digits <= 60:
        raise ConfigError("digits", digits, "must be an integer from 1 to 60")
    q = Fraction(value)
    if q.denominator == 1:
        return f"{q.numerator:,}"
    f = float(q)
    text = f"{f:.{digits}g}"
    if "e" not in text and abs(f) >= 1:
        whole = f"{f:,.{max(0, digits - len(str(int(abs(f)))))}f}".rstrip("0").rstrip(".")
        text = whole
    if q.denominator <= 10_000:
        text += f" ({q.numerator}/{q.denominator})"
    return text
