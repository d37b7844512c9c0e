"""Inputs printed with precision: the interval of values a claim's rounded inputs imply.

A real-valued input written with a decimal point, an exponent or a ``~`` was rounded at its last digit
(:func:`distcheck.audit.key_values.input_step`); a claim on such inputs is judged over the values its
quantity takes as each rounded input ranges over its printed value +- half its step, both ends
included (the digits cannot show which tie rule rounded them, as for one figure:
:mod:`distcheck.audit.figures`). Everything is exact (:class:`fractions.Fraction`). docs/AUDIT.md,
"Inputs printed with precision".
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from fractions import Fraction

from distcheck.audit import quantities as qmod
from distcheck.audit.counts import is_whole_unit
from distcheck.audit.key_values import ROUNDED_INPUT_KINDS, input_step
from distcheck.audit.keys import Claim
from distcheck.audit.quantity import InputValues
from distcheck.core.errors import ConfigError

__all__ = ["MAX_ROUNDED_INPUTS", "input_steps", "span_of_inputs", "meets"]

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
    names = [n for n in steps if n in values]
    if not names or len(names) > MAX_ROUNDED_INPUTS or q.array or is_whole_unit(q.unit) or q.compute is None:
        return None
    ends = []
    for n in names:
        qi = q.input(n)
        lo, hi = values[n] - steps[n] / 2, values[n] + steps[n] / 2
        if lo < 0 or (lo == 0 and qi is not None and qi.kind == "positive"):
            return None
        ends.append((lo, hi))
    out: list[Fraction] = []
    for corner in itertools.product(*ends):
        try:
            out.append(evaluate(q, {**values, **dict(zip(names, corner, strict=True))}, unit))
        except (ConfigError, ValueError, TypeError):
            return None
    return min(out), max(out)


def meets(span: tuple[Fraction, Fraction] | None, claimed: object, step: Fraction) -> bool:
    """``span`` meets what a figure ``claimed`` (+- ``step`` / 2) stands for, both closed:
    lo <= c + r/2 and hi >= c - r/2. False without a span or for a vector figure."""
    if span is None or not isinstance(claimed, Fraction):
        return False
    return span[0] <= claimed + step / 2 and span[1] >= claimed - step / 2
