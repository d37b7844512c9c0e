"""Inputs printed with precision: the interval of values a claim's rounded inputs imply.

A real-valued input written with a decimal point, an exponent or a ``~`` was rounded at its last digit
(:func:`distcheck.audit.key_values.input_step`); a claim on such inputs is judged over the values its
quantity takes as each rounded input ranges over its printed value +- half its step, both ends
included (the digits cannot show which tie rule rounded them, as for one figure:
:mod:`distcheck.audit.figures`). :func:`read_rounding` says what the rounding must be for a figure to hold:
for each rounded input, the values of it alone that make the figure hold and the nearest to the printed one
(a verdict ``holds-through-input-rounding`` names them; two claims that need different values contradict each
other). Everything is exact (:class:`fractions.Fraction`) except the bisection of a form neither affine nor
reciprocal in an input. docs/AUDIT.md, "Inputs printed with precision" and "Claims that contradict each other".
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from distcheck.audit import quantities as qmod
from distcheck.audit.counts import is_whole_unit
from distcheck.audit.key_values import ROUNDED_INPUT_KINDS, input_step
from distcheck.audit.keys import Claim
from distcheck.audit.quantity import InputValues
from distcheck.core.errors import ConfigError

__all__ = ["MAX_ROUNDED_INPUTS", "InputReading", "RoundingReading", "input_steps", "span_of_inputs", "meets",
           "read_rounding", "describe"]

#: the most rounded inputs one claim is judged over (2**n evaluations); beyond, it is judged at the printed values
MAX_ROUNDED_INPUTS = 6

#: ``evaluate(quantity, values, unit)``: the exact value of the quantity at ``values``, in ``unit``
Evaluate = Callable[[qmod.Quantity, InputValues, str], Fraction]


def input_steps(c: Claim, q: qmod.Quantity) -> dict[str, Fraction]:
    """The rounding step of each input claim ``c`` prints with precision, in the input's unit; inputs read
    exactly are left out."""
    out: dict[str, Fraction] = {}
    for name, v in c.inputs.items():
        qi = q.input(name)
        if qi is not None and qi.kind in ROUNDED_INPUT_KINDS:
            step = input_step(v, qi.kind, qi.unit if qmod.is_known_unit(qi.unit) else "")
            if step > 0:
                out[name] = step
    return out


def _box(q: qmod.Quantity, values: InputValues,
         steps: dict[str, Fraction]) -> list[tuple[str, Fraction, Fraction]] | None:
    """[(name, low end, high end)] of the box of rounded inputs, or None when the claim is judged at the printed
    values (see :func:`span_of_inputs`)."""
    names = [n for n in steps if n in values]
    if not names or len(names) > MAX_ROUNDED_INPUTS or q.array or is_whole_unit(q.unit) or q.compute is None:
        return None
    out = []
    for n in names:
        qi = q.input(n)
        lo, hi = values[n] - steps[n] / 2, values[n] + steps[n] / 2
        if lo < 0 or (lo == 0 and qi is not None and qi.kind == "positive"):
            return None
        out.append((n, lo, hi))
    return out


def span_of_inputs(q: qmod.Quantity, values: InputValues, steps: dict[str, Fraction], unit: str,
                   evaluate: Evaluate) -> tuple[Fraction, Fraction] | None:
    """(least, greatest) value ``q`` takes, in ``unit``, as each input of ``steps`` ranges over its value in
    ``values`` +- half its step; None when no input is rounded.

    Exact interval arithmetic on the corners of the box of inputs: the closed forms are monotone in each
    real-valued input over its domain (products, quotients and sums of the inputs), so the least and the
    greatest value lie at corners and, the forms being continuous there, every value between is taken. A
    quantity that counts whole things or is a vector, more than :data:`MAX_ROUNDED_INPUTS` rounded inputs,
    a box leaving a positive input's domain, or a corner the quantity refuses is judged at the printed
    values (None)."""
    corners = _corners(q, values, steps, unit, evaluate)
    if corners is None:
        return None
    out = [v for _, v in corners]
    return min(out), max(out)


def _corners(q: qmod.Quantity, values: InputValues, steps: dict[str, Fraction], unit: str,
             evaluate: Evaluate) -> list[tuple[dict[str, Fraction], Fraction]] | None:
    """Every corner of the box of rounded inputs with the value there, or None (see :func:`span_of_inputs`)."""
    box = _box(q, values, steps)
    if box is None:
        return None
    names = [n for n, _, _ in box]
    out = []
    for corner in itertools.product(*((lo, hi) for _, lo, hi in box)):
        at = dict(zip(names, corner, strict=True))
        try:
            out.append((at, evaluate(q, {**values, **at}, unit)))
        except (ConfigError, ValueError, TypeError):
            return None
    return out


def meets(span: tuple[Fraction, Fraction] | None, claimed: object, step: Fraction) -> bool:
    """``span`` meets what a figure ``claimed`` (+- ``step`` / 2) stands for, both closed:
    lo <= c + r/2 and hi >= c - r/2. False without a span or for a vector figure."""
    if span is None or not isinstance(claimed, Fraction):
        return False
    return span[0] <= claimed + step / 2 and span[1] >= claimed - step / 2


# ----------------------------------------------------------------------------- what the rounding must be


#: halvings of a bracket when a value of an input is neither affine nor reciprocal in it (2^-64 of its half step)
_BISECTIONS = 64


@dataclass(frozen=True)
class InputReading:
    """One input printed with precision, read for one claim.

    ``printed`` is the input's value as printed and ``half_step`` half its rounding step, both in ``unit`` (the
    input's unit); ``holds_for`` is the closed interval of values of this input alone, the other inputs as
    printed, within ``printed`` +- ``half_step``, at which the claim's figure holds (None: no such value).
    Its ends are exact when the quantity is affine in the input or in its reciprocal (every rate, time and
    size form of the catalogue), else found by bisection to 2^-64 of the half step, on the side where the
    figure holds."""

    name: str
    unit: str
    printed: Fraction
    half_step: Fraction
    holds_for: tuple[Fraction, Fraction] | None

    @property
    def nearest(self) -> Fraction | None:
        """The value in ``holds_for`` nearest ``printed`` (``printed`` itself when it is inside); None without one."""
        if self.holds_for is None:
            return None
        lo, hi = self.holds_for
        return min(max(self.printed, lo), hi)

    @property
    def relative(self) -> Fraction | None:
        """(nearest - printed) / printed: how far the nearest value that makes the figure hold is from the
        printed one, relative to it (0 when the figure holds at the printed value); None without one."""
        n = self.nearest
        return None if n is None else (n - self.printed) / self.printed


@dataclass(frozen=True)
class RoundingReading:
    """How a claim's verdict depends on the rounding of its inputs printed with precision.

    ``at_printed``: the figure holds at the printed inputs. ``inputs``: one :class:`InputReading` per rounded
    input. ``joint``: when the figure holds in the box of rounded inputs but at no value of one input alone,
    a point of the box where it holds ``((name, value), ...)``, found on the segment from the printed inputs
    to the corner that comes closest to the figure; empty otherwise."""

    at_printed: bool
    inputs: tuple[InputReading, ...]
    joint: tuple[tuple[str, Fraction], ...] = ()


def _solve(g: Callable[[Fraction], Fraction], a: Fraction, b: Fraction, target: Fraction,
           inside: Callable[[Fraction], bool]) -> Fraction:
    """A point x of [a, b] with g(x) == target, g continuous with g(a), g(b) on either side of ``target``:
    exact when g is affine in x or in 1/x (checked by evaluating g there), else bisected to a point where
    ``inside`` holds of g (the bracket's end on the side of ``target`` the caller wants)."""
    ga, gb = g(a), g(b)
    candidates = []
    if gb != ga:
        candidates.append(a + (target - ga) * (b - a) / (gb - ga))
        if a > 0:
            u = 1 / a + (target - ga) * (1 / b - 1 / a) / (gb - ga)
            if u > 0:
                candidates.append(1 / u)
    for x in candidates:
        if a <= x <= b or b <= x <= a:
            try:
                if g(x) == target:
                    return x
            except (ConfigError, ValueError, TypeError, ArithmeticError):
                pass
    lo, hi = a, b  # g(lo) and g(hi) straddle target
    below = ga < target
    for _ in range(_BISECTIONS):
        mid = (lo + hi) / 2
        gm = g(mid)
        if gm == target:
            return mid
        if (gm < target) == below:
            lo = mid
        else:
            hi = mid
    return lo if inside(g(lo)) else hi


def _preimage(g: Callable[[Fraction], Fraction], a: Fraction, b: Fraction, low: Fraction,
              high: Fraction) -> tuple[Fraction, Fraction] | None:
    """The interval of x in [a, b] (a < b) with low <= g(x) <= high, g monotone and continuous; None if empty."""
    ga, gb = g(a), g(b)
    if min(ga, gb) > high or max(ga, gb) < low:
        return None

    def inside(v: Fraction) -> bool:
        return low <= v <= high

    if ga <= gb:  # increasing: from where g reaches low to where it passes high
        x0 = a if ga >= low else _solve(g, a, b, low, inside)
        x1 = b if gb <= high else _solve(g, a, b, high, inside)
    else:  # decreasing: from where g falls to high to where it passes low
        x0 = a if ga <= high else _solve(g, a, b, high, inside)
        x1 = b if gb >= low else _solve(g, a, b, low, inside)
    return (x0, x1) if x0 <= x1 else None


def read_rounding(q: qmod.Quantity, values: InputValues, steps: dict[str, Fraction], unit: str,
                  claimed: object, step: Fraction, evaluate: Evaluate) -> RoundingReading | None:
    """How the figure ``claimed`` (+- ``step`` / 2, in ``unit``) of quantity ``q`` depends on the rounding of
    its inputs printed with precision (``steps``, as from :func:`input_steps`): for each, the values of it
    alone that make the figure hold, and a joint point when no one input suffices (:class:`RoundingReading`).
    None when the claim is judged at the printed values (the cases of :func:`span_of_inputs`), the figure is a
    vector, or a value in the box cannot be evaluated."""
    if not isinstance(claimed, Fraction):
        return None
    box = _box(q, values, steps)
    corners = _corners(q, values, steps, unit, evaluate)
    if box is None or corners is None:
        return None
    low, high = claimed - step / 2, claimed + step / 2
    try:
        here = evaluate(q, dict(values), unit)
        readings = []
        for name, lo, hi in box:
            def g(x: Fraction, name: str = name) -> Fraction:
                return evaluate(q, {**values, name: x}, unit)

            qi = q.input(name)
            readings.append(InputReading(name, qi.unit if qi is not None else "", values[name], steps[name] / 2,
                                         _preimage(g, lo, hi, low, high)))
        joint: tuple[tuple[str, Fraction], ...] = ()
        at_printed = low <= here <= high
        if not at_printed and all(r.holds_for is None for r in readings):
            joint = _joint(q, values, unit, evaluate, corners, here, low, high)
    except (ConfigError, ValueError, TypeError, ArithmeticError):
        return None
    return RoundingReading(at_printed, tuple(readings), joint)


def _joint(q: qmod.Quantity, values: InputValues, unit: str, evaluate: Evaluate,
           corners: Sequence[tuple[dict[str, Fraction], Fraction]], here: Fraction, low: Fraction,
           high: Fraction) -> tuple[tuple[str, Fraction], ...]:
    """A point of the box where the figure [low, high] holds, on the segment from the printed inputs to the corner
    nearest the figure (or inside it); () when no corner reaches it."""
    target = low if here < low else high
    reach = [(at, v) for at, v in corners if (v >= low if here < low else v <= high)]
    if not reach:
        return ()
    at, _ = min(reach, key=lambda c: abs(c[1] - target))
    start = {n: values[n] for n in at}

    def point(s: Fraction) -> dict[str, Fraction]:
        return {n: start[n] + s * (at[n] - start[n]) for n in at}

    def g(s: Fraction) -> Fraction:
        return evaluate(q, {**values, **point(s)}, unit)

    s = _solve(g, Fraction(0), Fraction(1), target, lambda v: low <= v <= high)
    return tuple(point(s).items())


def _pct(x: Fraction) -> str:
    return f"{float(x) * 100:+.3g}%"


def describe(reading: RoundingReading, fmt: Callable[[Fraction], str]) -> str:
    """What ``reading`` says, as text: for each rounded input, the values of it that make the figure hold and the
    nearest one, with its distance from the printed value relative to it; or the joint point. ``fmt`` formats
    one exact value."""
    parts, alone = [], []
    for r in reading.inputs:
        u = f" {r.unit}" if r.unit else ""
        if r.holds_for is None:
            alone.append(r.name)
            continue
        lo, hi = r.holds_for
        span = f"{r.name} from {fmt(lo)} to {fmt(hi)}{u}" if lo != hi else f"{r.name} = {fmt(lo)}{u}"
        nearest, rel = r.nearest, r.relative
        assert nearest is not None and rel is not None  # holds_for is not None
        if rel == 0:
            parts.append(f"{span} (the printed {fmt(r.printed)} included)")
        else:
            parts.append(f"{span} (nearest {fmt(nearest)}{u}, {_pct(rel)} from the printed {fmt(r.printed)}; "
                         f"its rounding allows +-{float(r.half_step / r.printed) * 100:.3g}%)")
    if reading.joint:
        by = {r.name: r for r in reading.inputs}
        moved = ", ".join(f"{n} = {fmt(v)}{' ' + by[n].unit if by[n].unit else ''} "
                          f"({_pct((v - by[n].printed) / by[n].printed)} from the printed {fmt(by[n].printed)})"
                          for n, v in reading.joint)
        parts.append(f"no one input alone, but {' and '.join(n for n, _ in reading.joint)} together, e.g. {moved}")
    elif alone and parts:
        parts.append(f"{', '.join(alone)} alone: no value within {'its' if len(alone) == 1 else 'their'} rounding")
    return "; ".join(parts) or "values within the printed precision of its inputs"
