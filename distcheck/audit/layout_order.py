"""The mesh order as an input of every ``layout.*`` quantity.

The closed forms ``layout.rank``, ``layout.coordinate.*`` and ``layout.tp_groups_node_local``
are written for Llama 3's order ``[TP, CP, PP, DP]`` (innermost first). A figure printed
under another order (Megatron-core's ``tp-cp-ep-dp-pp``, ``tp-dp-pp``, dp innermost ...)
must be audited under that order, or it gets a confident verdict about the wrong layout.
So a claim on any ``layout.*`` quantity may give ``order = "tp-cp-ep-dp-pp"`` among its
inputs (innermost first; tp, cp, pp, dp, ep, each at most once; ep, carved from the
data-parallel ranks, is dropped as in :class:`distcheck.parallel.layout.ParallelConfig`). For the
order-dependent quantities the order changes the value, and their degrees tp, cp, pp and
dp may all be given (an axis's degree is needed when another axis lies outside it); the
value is then computed by the reference, :mod:`distcheck.parallel.layout`, under that order. For
the others (world size, group counts, fractions) the order is checked and changes nothing.
Without ``order`` a claim is read under the default order.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from distcheck.core.errors import ConfigError
from distcheck.core.vocab import LAYOUT_ORDER, Axis
from distcheck.parallel.layout import MEGATRON_DEFAULT_ORDER

__all__ = ["DEFAULT", "ORDERED", "DEGREES", "ALTERNATIVE_ORDERS", "accepts_order", "extra_inputs", "listed_inputs",
           "parse", "compute", "alternatives"]

#: the order a claim is read under when it states none: Llama 3's, innermost first ("tp-cp-pp-dp")
DEFAULT = "-".join(LAYOUT_ORDER)

#: the layout quantities whose value depends on the order
ORDERED = ("layout.rank", "layout.coordinate.tp", "layout.coordinate.cp", "layout.coordinate.pp",
           "layout.coordinate.dp", "layout.tp_groups_node_local")
DEGREES = tuple(a.value for a in LAYOUT_ORDER)


def accepts_order(quantity: str) -> bool:
    """True for every ``layout.*`` quantity."""
    return isinstance(quantity, str) and quantity.startswith("layout.")


def extra_inputs(quantity: str, input_names: tuple[str, ...]) -> tuple[str, ...]:
    """The degrees an order-dependent quantity accepts beyond its closed form's inputs."""
    if quantity not in ORDERED:
        return ()
    return tuple(d for d in DEGREES if d not in input_names)


def listed_inputs(quantity: str, input_names: tuple[str, ...]) -> list[dict]:
    """The inputs ``distcheck audit --list`` adds to a layout quantity: the order, and the degrees
    :func:`extra_inputs` names (none for another quantity)."""
    if not accepts_order(quantity):
        return []
    order = [{"name": "order", "unit": "", "kind": "order", "default": DEFAULT,
              "description": f"mesh axes innermost first, e.g. '{MEGATRON_DEFAULT_ORDER}' "
                             "(distcheck.audit.layout_order)"}]
    return order + [{"name": d, "unit": "GPUs", "kind": "positive_integer", "default": "when the order needs it",
                     "description": f"{d} degree, needed under an order that puts an axis outside {d}"}
                    for d in extra_inputs(quantity, input_names)]


def parse(text: object) -> tuple[str, ...]:
    """An order string as a tuple, innermost first; ConfigError for anything else (not a string,
    an unknown or repeated axis)."""
    from distcheck.parallel.layout import AXES, parse_order

    if not isinstance(text, str):
        raise ConfigError("order", text, "must be a string of axes innermost first, e.g. 'tp-cp-ep-dp-pp'")
    axes = parse_order(text)
    for a in axes:
        if a not in AXES:
            raise ConfigError("order", text, f"names an unknown axis {a!r} (axes: {', '.join(AXES)})")
    return axes


#: orders a layout figure printed without its order is also read under (a documented convention each)
ALTERNATIVE_ORDERS = (
    (MEGATRON_DEFAULT_ORDER, f"mesh order {MEGATRON_DEFAULT_ORDER} (Megatron-core's default; torchtitan's dense mesh "
                             "with dp = dp_replicate x dp_shard)"),
)


def alternatives(quantity: str, values: Mapping[str, Fraction]) -> list[tuple[str, Fraction]]:
    """(convention name, value) under each of :data:`ALTERNATIVE_ORDERS` that gives another value than the
    default order; orders the claim's degrees cannot be read under (a degree missing) are skipped."""
    if quantity not in ORDERED:
        return []
    out = []
    try:
        default = compute(quantity, values, DEFAULT)
    except ConfigError:
        default = None
    for order, name in ALTERNATIVE_ORDERS:
        try:
            value = compute(quantity, values, order)
        except ConfigError:
            continue
        if value != default:
            out.append((name, value))
    return out


def _axes(order: str) -> list[str]:
    """The four mesh axes innermost first: the order's (ep dropped), then those it leaves out (outermost)."""
    given = [a for a in parse(order) if a != Axis.EP]
    return given + [a for a in DEGREES if a not in given]


def _degree(values: Mapping[str, Fraction], axis: str, order: str, why: str) -> int:
    if axis not in values:
        raise ConfigError(axis, None, f"is required under order {order!r}: {why}")
    return int(values[axis])


def compute(quantity: str, values: Mapping[str, Fraction], order: str) -> Fraction:
    """The value of an order-dependent quantity under ``order`` (exact): the strides of the order
    (rank = sum of index x stride, stride = product of the degrees inside; as
    :func:`distcheck.parallel.layout.coords`), and :func:`distcheck.parallel.layout.groups_node_local` for node
    locality. Raises ConfigError naming a degree the order needs that the claim does not give, or an
    index out of range."""
    axes = _axes(order)
    v = dict(values)
    for a in DEGREES:  # as distcheck.parallel.layout.ParallelConfig: an axis of degree > 1 may not be left out
        if a not in parse(order) and int(v.get(a, 1)) > 1:
            raise ConfigError("order", order, f"must list {a!r} ({a}={int(v[a])} > 1)")
    if quantity == "layout.rank":
        rank, stride = 0, 1
        for i, a in enumerate(axes):
            idx = int(v.get(f"{a}_index", 0))
            last = i == len(axes) - 1
            deg = None if last else _degree(v, a, order, f"an axis lies outside {a}")
            if deg is not None and idx >= deg:
                raise ConfigError(f"{a}_index", idx, f"must be < {a}={deg}")
            rank += idx * stride
            stride *= deg or 1
        return Fraction(rank)
    if quantity.startswith("layout.coordinate."):
        axis = quantity.rsplit(".", 1)[1]
        k = axes.index(axis)
        stride = 1
        for a in axes[:k]:
            stride *= _degree(v, a, order, f"{a} lies inside {axis}")
        q = int(v["rank"]) // stride
        if k == len(axes) - 1:
            return Fraction(q)
        return Fraction(q % _degree(v, axis, order, f"an axis lies outside {axis}"))
    if quantity == "layout.tp_groups_node_local":
        from distcheck.parallel.layout import ParallelConfig, groups_node_local

        inner = axes[:axes.index(Axis.TP)]
        # keyword arguments of ParallelConfig: degrees by axis name
        degrees: dict[str, Any] = {a: _degree(v, a, order, f"{a} lies inside tp") for a in inner}
        degrees.update({a: int(v[a]) for a in DEGREES if a in v})
        cfg = ParallelConfig(**degrees, order=tuple(axes), gpus_per_node=int(v["gpus_per_node"]))
        return Fraction(int(groups_node_local(cfg, "tp")))
    raise ConfigError("quantity", quantity, f"does not depend on the order (order-dependent: {', '.join(ORDERED)})")
