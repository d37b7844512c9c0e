"""What a printed figure stands for, and when several printed figures can be consistent.

The rule (also in docs/AUDIT.md, "Figures, rounding and consistency"):

1. **Step.** A figure printed as ``c`` carries a rounding step ``r``: the key's
   ``rounding`` when it states one, else the step its digits imply. A decimal
   point, an exponent or an approximation mark says the figure was rounded at its
   last digit (``107.81``: 0.01; ``6.7e-02``: 0.001; ``~109``: 1). A whole number
   written in full (``5``, ``1,024``, ``16384``) is exact (``r = 0``), and so is a
   ratio (``"3/7"``). A stated rounding must divide the figure (a figure rounded
   to the nearest 10 is a multiple of 10).

2. **Values.** With ``r = 0`` the figure stands for ``c`` alone. With ``r > 0`` it
   stands for the exact values ``x`` that a rounding rule prints as ``c``:
   ``c - r/2 <= x <= c + r/2``, where each end belongs to the figure or to its
   neighbour (``c - r`` or ``c + r``) according to the rule's tie-break
   (:data:`TIE_RULES`). A figure in a unit that counts whole things (GPUs,
   layers, ranks, ...: :mod:`distcheck.audit.counts`) stands only for the whole
   numbers among those values, in the unscaled unit (``16 M tokens`` to the
   nearest million is a whole number of tokens).

3. **One figure against a recomputed value** (a claim): it holds when the value
   is one the figure stands for under *some* tie rule, i.e. ``|x - c| <= r/2``
   with both ends included. One figure cannot show which tie rule its source
   used, so neither end is refused.

4. **Figures against each other** (a ``sum``, ``product`` or ``equal`` check):
   consistent when, for *one* tie rule applied to every figure, there are values
   the figures stand for that satisfy the relation exactly. One source rounds
   with one rule, so ranges that meet only at a tie which the figures would need
   broken in opposite directions are a contradiction: ``4`` and ``5`` to the
   nearest unit share only 4.5, which no single rule prints as both.

The tie rules tried are the three in common use: half away from zero (school
rounding, C ``round``, spreadsheets' ROUND; "half up" for the non-negative
figures audited here), half toward zero (``decimal.ROUND_HALF_DOWN``) and half
to even (IEEE 754's default, Python's ``round`` and ``format``, ``numpy.round``).

Everything is exact (:class:`fractions.Fraction`). Sums are decided by interval
arithmetic on the exact ends (with their open or closed ends, and whole numbers
gathered into one integer range); products of non-negative figures likewise,
enumerating whole-number factors when a rounded count admits several values (at
most :data:`MAX_WHOLE_COMBINATIONS`).
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from distcheck.core.errors import ConfigError
from distcheck.core.validate import check_choice, check_type

__all__ = [
    "MAX_WHOLE_COMBINATIONS",
    "TIE_RULES",
    "Figure",
    "Outcome",
    "Span",
    "check_equal",
    "check_product",
    "check_sum",
    "span_of",
]

HALF_AWAY, HALF_TOWARD, HALF_EVEN = "half away from zero", "half toward zero", "half to even"
#: the tie-breaking rules a source may have rounded with (see the module docstring)
TIE_RULES = (HALF_AWAY, HALF_TOWARD, HALF_EVEN)

#: the most combinations of whole values a product check enumerates (rounded counts as factors)
MAX_WHOLE_COMBINATIONS = 10_000


@dataclass(frozen=True)
class Span:
    """The exact values ``lo .. hi``; each end is included when its ``*_closed`` flag is set."""

    lo: Fraction
    hi: Fraction
    lo_closed: bool = True
    hi_closed: bool = True

    @classmethod
    def point(cls, value: Fraction | int) -> Span:
        return cls(Fraction(value), Fraction(value))

    @property
    def empty(self) -> bool:
        return self.lo > self.hi or (self.lo == self.hi and not (self.lo_closed and self.hi_closed))

    def __add__(self, other: Span) -> Span:
        return Span(self.lo + other.lo, self.hi + other.hi,
                    self.lo_closed and other.lo_closed, self.hi_closed and other.hi_closed)

    def __neg__(self) -> Span:
        return Span(-self.hi, -self.lo, self.hi_closed, self.lo_closed)

    def __and__(self, other: Span) -> Span:
        """The intersection."""
        if self.lo != other.lo:
            lo, lo_closed = max((self.lo, self.lo_closed), (other.lo, other.lo_closed), key=lambda e: e[0])
        else:
            lo, lo_closed = self.lo, self.lo_closed and other.lo_closed
        if self.hi != other.hi:
            hi, hi_closed = min((self.hi, self.hi_closed), (other.hi, other.hi_closed), key=lambda e: e[0])
        else:
            hi, hi_closed = self.hi, self.hi_closed and other.hi_closed
        return Span(lo, hi, lo_closed, hi_closed)

    def whole_range(self) -> tuple[int, int] | None:
        """(smallest, largest) whole number in the span, None if it holds none."""
        if self.empty:
            return None
        a = math.ceil(self.lo) if self.lo_closed else math.floor(self.lo) + 1
        b = math.floor(self.hi) if self.hi_closed else math.ceil(self.hi) - 1
        return (a, b) if a <= b else None

    def times(self, other: Span) -> Span:
        """The products x*y (both spans non-negative and not empty)."""
        lo, hi = self.lo * other.lo, self.hi * other.hi
        if lo == 0:  # reached when either span holds 0
            lo_closed = (self.lo == 0 and self.lo_closed) or (other.lo == 0 and other.lo_closed)
        else:
            lo_closed = self.lo_closed and other.lo_closed
        hi_closed = True if hi == 0 else (self.hi_closed and other.hi_closed)
        return Span(lo, hi, lo_closed, hi_closed)


@dataclass(frozen=True)
class Figure:
    """A printed figure in the unscaled unit of its family.

    ``value`` is the printed number and ``step`` its rounding step (0: exact), both
    converted to the unscaled unit (``1.5 GB`` -> 1,500,000,000 bytes, step 10**8);
    ``whole`` marks a count of whole things.
    """

    value: Fraction
    step: Fraction = Fraction(0)
    whole: bool = False

    def __post_init__(self) -> None:
        check_type("value", self.value, Fraction, "must be a Fraction")
        check_type("step", self.step, Fraction, "must be a Fraction")
        if self.step < 0:
            raise ConfigError("step", self.step, "must be >= 0")
        if self.step and (self.value / self.step).denominator != 1:
            raise ConfigError("rounding", self.step, f"must divide the printed figure {self.value}")


def span_of(figure: Figure, rule: str | None = None) -> Span:
    """The exact values ``figure`` stands for under tie rule ``rule`` (one of :data:`TIE_RULES`),
    or under any rule (both ends included) when ``rule`` is None. Whole numbers are not
    singled out here: see :func:`Span.whole_range`. ConfigError for another rule."""
    check_type("figure", figure, Figure, "must be a Figure")
    if rule is not None:
        check_choice("rule", rule, TIE_RULES)
    c, r = figure.value, figure.step
    if r == 0:
        return Span.point(c)
    half = r / 2
    if rule is None:
        return Span(c - half, c + half)
    if rule == HALF_EVEN:
        even = (c / r).numerator % 2 == 0
        return Span(c - half, c + half, even, even)
    # the lower end ties c - r with c; the upper end ties c with c + r
    away_keeps_lower = c > 0       # |c| > |c - r| exactly when c > 0 (c is a multiple of r)
    away_keeps_upper = c < 0
    if rule == HALF_AWAY:
        return Span(c - half, c + half, away_keeps_lower, away_keeps_upper)
    return Span(c - half, c + half, not away_keeps_lower, not away_keeps_upper)  # HALF_TOWARD


@dataclass(frozen=True)
class Outcome:
    """The verdict of one consistency check.

    ``consistent``: some tie rule admits values satisfying the relation; ``rules``: the
    tie rules that do (all three when the figures do not meet at a tie); ``meets``: the
    relation holds when each figure may break its ties either way (so a contradiction
    with ``meets`` is one where the figures meet only at a tie no single rule prints as
    every figure); ``combined``: what the parts combine to under the widest reading
    (any rule; whole numbers narrowed to their range), None for ``equal``; ``empty``:
    indices (total first, then the parts) of whole-count figures that stand for no
    whole number (e.g. ``26.7 layers``), each a contradiction by itself.
    """

    consistent: bool
    rules: tuple[str, ...]
    meets: bool
    combined: Span | None = None
    empty: tuple[int, ...] = ()

    @property
    def needs_tie_rule(self) -> bool:
        """Consistent under some tie rules only: the figures meet at a tie."""
        return self.consistent and len(self.rules) < len(TIE_RULES)


def _whole_span(figure: Figure, rule: str | None) -> Span | None:
    """The figure's values under ``rule``, narrowed to whole numbers when it is a count."""
    s = span_of(figure, rule)
    if not figure.whole:
        return s
    w = s.whole_range()
    return None if w is None else Span(Fraction(w[0]), Fraction(w[1]))


def _empties(figures: Sequence[Figure]) -> tuple[int, ...]:
    return tuple(i for i, f in enumerate(figures) if _whole_span(f, None) is None)


def _has_whole(s: Span) -> bool:
    return s.whole_range() is not None


def _figures(field: str, figures: Sequence[Figure]) -> list[Figure]:
    """``figures`` as a non-empty list of Figure (ConfigError otherwise)."""
    check_type(field, figures, (list, tuple), "must be a list of Figure")
    for i, f in enumerate(figures):
        check_type(f"{field}[{i}]", f, Figure, "must be a Figure")
    if not figures:
        raise ConfigError(field, [], "must hold at least one figure")
    return list(figures)


def _outcome(figures: Sequence[Figure], decide: Callable[[str | None], bool], combined: Span | None) -> Outcome:
    empty = _empties(figures)
    if empty:
        return Outcome(False, (), False, combined, empty)
    rules = tuple(r for r in TIE_RULES if decide(r))
    return Outcome(bool(rules), rules, bool(rules) or decide(None), combined, ())


def check_equal(figures: Sequence[Figure]) -> Outcome:
    """All figures stand for one common value (same unscaled unit). ConfigError unless
    ``figures`` is a non-empty list of Figure."""
    figures = _figures("figures", figures)

    def decide(rule: str | None) -> bool:
        spans = [s for s in (_whole_span(f, rule) for f in figures) if s is not None]
        if len(spans) < len(figures):
            return False
        common = functools.reduce(operator.and_, spans)
        if common.empty:
            return False
        return _has_whole(common) if any(f.whole for f in figures) else True

    return _outcome(figures, decide, None)


def _linear(total: Figure, parts: Sequence[Figure], rule: str | None) -> tuple[Span | None, Span] | None:
    """sum(parts) - total as (whole-number range or None, real span); None if a count holds no value."""
    whole: Span | None = None
    real = Span.point(0)
    for sign, f in [(1, p) for p in parts] + [(-1, total)]:
        s = _whole_span(f, rule)
        if s is None:
            return None
        s = s if sign > 0 else -s
        if f.whole:
            whole = s if whole is None else whole + s
        else:
            real = real + s
    return whole, real


def _zero_reachable(whole: Span | None, real: Span) -> bool:
    """Is 0 = n + y for a whole n in ``whole`` (if any) and a real y in ``real``?"""
    if whole is None:
        return not real.empty and real.lo <= 0 <= real.hi and (real.lo < 0 or real.lo_closed) and (
            real.hi > 0 or real.hi_closed)
    return _has_whole(whole & -real)


def check_sum(total: Figure, parts: Sequence[Figure]) -> Outcome:
    """``total`` = sum of ``parts`` (all in the same unscaled unit; literal parts have step 0).
    ConfigError unless ``total`` is a Figure and ``parts`` a non-empty list of them."""
    check_type("total", total, Figure, "must be a Figure")
    parts = _figures("parts", parts)

    def decide(rule: str | None) -> bool:
        lin = _linear(total, parts, rule)
        return lin is not None and _zero_reachable(*lin)

    combined = Span.point(0)
    for p in parts:
        s = _whole_span(p, None)
        if s is None:
            combined = Span(Fraction(1), Fraction(0))  # empty: a part holds no whole number
            break
        combined = combined + s
    return _outcome([total, *parts], decide, combined)


def _nonneg(figure: Figure, rule: str | None) -> Span | None:
    s = _whole_span(figure, rule)
    if s is None:
        return None
    s = s & Span(Fraction(0), max(s.hi, Fraction(0)))
    return None if s.empty else s


def _whole_values(spans: Sequence[Span]) -> list[int]:
    """Every product of one whole value from each span (spans hold whole ends)."""
    sizes = [int(s.hi - s.lo) + 1 for s in spans]
    n = math.prod(sizes)
    if n > MAX_WHOLE_COMBINATIONS:
        raise ConfigError("parts", n, f"admit more than {MAX_WHOLE_COMBINATIONS:,} combinations of whole values; "
                          "state the rounding of the counts more tightly")
    products = {1}
    for s in spans:
        products = {p * v for p in products for v in range(int(s.lo), int(s.hi) + 1)}
    return sorted(products)


def check_product(total: Figure, parts: Sequence[Figure]) -> Outcome:
    """``total`` = product of ``parts``; every figure measures something non-negative, so
    values below 0 are not considered. Raises ConfigError when rounded counts among the
    parts admit more than :data:`MAX_WHOLE_COMBINATIONS` combinations, or unless ``total`` is a
    Figure and ``parts`` a non-empty list of them."""
    check_type("total", total, Figure, "must be a Figure")
    parts = _figures("parts", parts)
    figures = [total, *parts]

    def product(rule: str | None) -> tuple[list[int], Span] | None:
        whole_spans, real = [], Span.point(1)
        for p in parts:
            s = _nonneg(p, rule)
            if s is None:
                return None
            if p.whole:
                whole_spans.append(s)
            else:
                real = real.times(s)
        return _whole_values(whole_spans), real

    def decide(rule: str | None) -> bool:
        got, t = product(rule), _nonneg(total, rule)
        if got is None or t is None:
            return False
        for n in got[0]:
            s = got[1].times(Span.point(n)) & t
            if not s.empty and (not total.whole or _has_whole(s)):
                return True
        return False

    got = product(None)
    combined = None
    if got is not None:
        combined = got[1].times(Span(Fraction(got[0][0]), Fraction(got[0][-1])))
    return _outcome(figures, decide, combined)
