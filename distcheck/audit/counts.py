"""Counts are whole numbers: which units count whole things, and how an uneven split is named.

GPUs, ranks, layers, stages, micro-batches, heads, parameters, tokens, ... are
whole numbers. A quantity in such a unit that the closed forms compute as a
fraction (80 layers over 3 stages: 80/3 per stage) is not a count of anything:
the inputs do not divide evenly. The audit then refuses to let a rounded figure
hold ("27 layers per stage" is the largest stage of an uneven split, not the
layers per stage) and names the split: ``num_layers=80 over p=3 is uneven:
27 + 27 + 26``.

Two count nouns are not whole: ``elements`` (per-rank communication volumes are
averages over the ranks: a ring all-reduce moves 2(n-1)/n of the tensor per rank,
a whole number of elements only when n divides it) and ``ticks`` (time in units
of one forward pass).
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction

from distcheck.audit import quantities as qmod
from distcheck.core.validate import check_type

__all__ = ["FRACTIONAL_COUNT_NOUNS", "WHOLE_COUNT_NOUNS", "is_whole_unit", "uneven_split"]

#: count nouns whose values are whole numbers
WHOLE_COUNT_NOUNS = frozenset({
    "count", "params", "GPUs", "tokens", "sequences", "layers", "stages", "micro-batches", "ranks", "nodes",
    "groups", "examples", "chunks", "heads", "collectives", "all-reduces", "columns",
})
#: count nouns whose values may be fractional (see the module docstring)
FRACTIONAL_COUNT_NOUNS = frozenset({"elements", "ticks"})

#: composites that share a whole count out: quantity -> (inputs multiplied into the count, inputs it is shared over)
_SHARES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "pp.layers_per_stage.even": (("num_layers",), ("p",)),
    "layout.nodes_per_replica": (("tp", "pp"), ("gpus_per_node",)),
}


def is_whole_unit(unit: str) -> bool:
    """True when ``unit`` counts whole things (``GPUs``, ``layers``, ``"B params"``, ...:
    :data:`WHOLE_COUNT_NOUNS`); False for other units and unknown ones."""
    family = qmod.unit_family(unit) if isinstance(unit, str) else None
    return family is not None and family.startswith("count:") and family[6:] in WHOLE_COUNT_NOUNS


def _share(quantity: str, values: Mapping[str, Fraction]) -> tuple[str, int, str, int] | None:
    """(count text, count, parts text, parts) of a quantity that is count / parts, None if unknown."""
    if quantity in _SHARES:
        num, den = _SHARES[quantity]
        try:
            n, d = _product(values, num), _product(values, den)
        except KeyError:
            return None
        return "*".join(num), n, "*".join(den), d
    from distcheck.closed_form import catalogue

    form = catalogue().get(quantity)
    if form is None:
        return None
    import sympy as sp

    num_expr, den_expr = sp.fraction(sp.together(form.expr))
    if not den_expr.free_symbols:
        return None
    subs = {form.symbols[k]: sp.Rational(v.numerator, v.denominator) for k, v in values.items() if k in form.symbols}
    n_val, d_val = num_expr.subs(subs), den_expr.subs(subs)
    if not (n_val.is_Integer and d_val.is_Integer) or d_val <= 0:
        return None
    return str(num_expr), int(n_val), str(den_expr), int(d_val)


def _product(values: Mapping[str, Fraction], names: tuple[str, ...]) -> int:
    out = Fraction(1)
    for name in names:
        out *= values[name]
    if out.denominator != 1:
        raise KeyError(names)
    return int(out)


def uneven_split(quantity: str, values: Mapping[str, Fraction], value: Fraction) -> str:
    """Why ``value`` (not whole) is no count: ``"num_layers=80 over p=3 is uneven: 27 + 27 + 26"``
    when the quantity is a count shared over parts, else ``"80/3 is not a whole number"``.

    ``values`` are the exact inputs the quantity was computed from (defaults filled).
    Raises ConfigError for arguments of the wrong type."""
    check_type("quantity", quantity, str, "must be a quantity name (a str)")
    check_type("values", values, Mapping, "must map input names to exact values")
    check_type("value", value, Fraction, "must be a Fraction")
    share = _share(quantity, values)
    exact = f"{value.numerator}/{value.denominator}"
    if share is None or share[3] <= 1 or share[1] % share[3] == 0:
        return f"{exact} is not a whole number"
    n_text, n, d_text, d = share
    head = f"{n_text}={n} over {d_text}={d}"
    q, r = divmod(n, d)
    if q == 0:
        return f"{head} is {exact}, less than one"
    if d <= 8:
        sizes = " + ".join(str(q + 1) for _ in range(r)) + " + " + " + ".join(str(q) for _ in range(d - r))
        return f"{head} is uneven: {sizes}"
    return f"{head} is uneven: {r} x {q + 1} + {d - r} x {q}"
