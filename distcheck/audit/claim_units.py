"""Units of the quantities a claim may be written in: families, scales, and the exact factor
between two units of one family (bytes, bandwidth in bytes per second, dimensionless, counts,
bytes per parameter, flags; for throughput claims FLOPs, FLOP/s, seconds, tokens per second and
GPU-hours).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

from distcheck.core.errors import ConfigError
from distcheck.core.units import BYTE_UNITS
from distcheck.core.validate import check_type

__all__ = ["KNOWN_UNITS_HELP", "is_known_unit", "unit_family", "unit_factor", "base_unit", "UnitBridge",
           "UNIT_BRIDGES", "bridge_between", "bridged_factor", "factor_across"]

# ----------------------------------------------------------------------------- units

_DIMENSIONLESS = {"fraction": Fraction(1), "ratio": Fraction(1), "x": Fraction(1), "%": Fraction(1, 100)}
_COUNT_NOUNS = {
    "count", "params", "GPUs", "elements", "ticks", "tokens", "sequences", "layers", "stages", "micro-batches",
    "ranks", "nodes", "groups", "examples", "chunks", "heads", "collectives", "all-reduces", "columns",
}
_ALIASES = {"GPU": "GPUs", "tick": "ticks", "token": "tokens", "param": "params", "parameters": "params",
            "layer": "layers", "sequence": "sequences", "B/param": "bytes_per_param",
            "bytes/param": "bytes_per_param", "byte": "bytes", "percent": "%", "bool": "flag"}
_SCALES = {"K": Fraction(10**3), "M": Fraction(10**6), "B": Fraction(10**9), "T": Fraction(10**12),
           "Ki": Fraction(2**10), "Mi": Fraction(2**20), "Gi": Fraction(2**30), "Ti": Fraction(2**40)}
_SCALED = re.compile(r"^(K|M|B|T|Ki|Mi|Gi|Ti) (\S+)$")

#: throughput families: unit -> factor to the family's base (FLOPs; FLOP/s; seconds; tokens/s; GPU-hours)
_PREFIX = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18, "Z": 10**21}
_THROUGHPUT: dict[str, dict[str, Fraction]] = {
    "flops": {"flops": Fraction(1), **{f"{p}FLOP{s}": Fraction(v) for p, v in _PREFIX.items() if p != "K"
                                       for s in ("", "s")}},
    "flop_rate": {"flops_per_second": Fraction(1),
                  **{f"{p}FLOP/s": Fraction(v) for p, v in _PREFIX.items() if p != "K"},
                  **{f"{p}FLOPS": Fraction(v) for p, v in _PREFIX.items() if p not in ("", "K")}},
    "time": {"seconds": Fraction(1), "s": Fraction(1), "ms": Fraction(1, 10**3), "us": Fraction(1, 10**6),
             "µs": Fraction(1, 10**6), "min": Fraction(60), "h": Fraction(3600), "hours": Fraction(3600),
             "days": Fraction(86400)},
    "token_rate": {"tokens_per_second": Fraction(1), "tokens/s": Fraction(1), "K tokens/s": Fraction(10**3),
                   "M tokens/s": Fraction(10**6)},
    "gpu_hours": {"gpu_hours": Fraction(1), "GPU-hours": Fraction(1), "K GPU-hours": Fraction(10**3),
                  "M GPU-hours": Fraction(10**6)},
}

#: quantity unit -> the family a claim unit must belong to
_FAMILY_OF_QUANTITY_UNIT = {
    "bytes": "bytes", "fraction": "dimensionless", "ratio": "dimensionless", "bytes_per_param": "bytes_per_param",
    "flag": "flag", "value": "value", "bytes_per_second": "bandwidth", "flops": "flops",
    "flops_per_second": "flop_rate", "seconds": "time", "tokens_per_second": "token_rate", "gpu_hours": "gpu_hours",
}

KNOWN_UNITS_HELP = (
    "bytes, B, KB, MB, GB, TB, KiB, MiB, GiB, TiB; bandwidth: B/s, KB/s, MB/s, GB/s, TB/s, KiB/s, MiB/s, GiB/s, "
    "TiB/s; fraction, ratio, x, %; bytes_per_param (B/param); flag; FLOPs: FLOP, FLOPs, GFLOPs, TFLOPs, PFLOPs, "
    "EFLOPs, ZFLOPs; FLOP/s: FLOP/s, GFLOP/s, TFLOP/s, PFLOP/s (or TFLOPS ...); time: s, ms, us, min, h, days; "
    "tokens/s, K tokens/s, M tokens/s; GPU-hours, K GPU-hours, M GPU-hours; "
    f"value; counts: {', '.join(sorted(_COUNT_NOUNS))} (optionally scaled: 'M tokens', 'B params', 'Mi tokens')"
)


def _canon(unit: str) -> str:
    return _ALIASES.get(unit, unit)


def _parse_unit(unit: str) -> tuple[str, Fraction] | None:
    """(family, factor to the family's base) or None if unknown."""
    if not isinstance(unit, str):
        return None
    u = _canon(unit.strip())
    if u in BYTE_UNITS:
        return "bytes", Fraction(BYTE_UNITS[u])
    if u == "bytes_per_second" or (u.endswith("/s") and u[:-2] in BYTE_UNITS):
        return "bandwidth", Fraction(1 if u == "bytes_per_second" else BYTE_UNITS[u[:-2]])
    if u in _DIMENSIONLESS:
        return "dimensionless", _DIMENSIONLESS[u]
    if u == "bytes_per_param":
        return "bytes_per_param", Fraction(1)
    if u == "flag":
        return "flag", Fraction(1)
    if u == "value":
        return "value", Fraction(1)
    for family, units in _THROUGHPUT.items():
        if u in units:
            return family, units[u]
    if u in _COUNT_NOUNS:
        return "count:" + u, Fraction(1)
    m = _SCALED.match(u)
    if m and _canon(m[2]) in _COUNT_NOUNS:
        return "count:" + _canon(m[2]), _SCALES[m[1]]
    return None


def is_known_unit(unit: object) -> bool:
    """True if ``unit`` is a unit an answer key may use."""
    return isinstance(unit, str) and _parse_unit(unit) is not None


def unit_family(unit: str) -> str | None:
    """The family of ``unit`` ("bytes", "dimensionless", "count:<noun>", ...), None if unknown."""
    p = _parse_unit(unit)
    return None if p is None else p[0]


#: family -> its unscaled unit (what a figure is converted to before figures are compared)
_BASE_UNIT_OF_FAMILY = {"bytes": "bytes", "bandwidth": "bytes_per_second", "dimensionless": "fraction",
                        "bytes_per_param": "bytes_per_param", "flag": "flag", "value": "value", "flops": "flops",
                        "flop_rate": "flops_per_second", "time": "seconds", "token_rate": "tokens_per_second",
                        "gpu_hours": "gpu_hours"}


def base_unit(unit: str) -> str:
    """The unscaled unit of ``unit``'s family, itself a unit :func:`unit_factor` knows: ``"bytes"`` for GB,
    ``"bytes_per_second"`` for GB/s, ``"fraction"`` for %, the noun for a count (``"tokens"`` for
    ``"M tokens"``). Raises ConfigError when ``unit`` is not a str or not a known unit."""
    check_type("unit", unit, str, "must be a unit name (a str)")
    family = unit_family(unit)
    if family is None:
        raise ConfigError("unit", unit, f"is not a known unit; known: {KNOWN_UNITS_HELP}")
    if family.startswith("count:"):
        return family[len("count:"):]
    return _BASE_UNIT_OF_FAMILY[family]


def _compatible(q_family: str, c_family: str) -> bool:
    if q_family == c_family:
        return True
    q_count, c_count = q_family.startswith("count:"), c_family.startswith("count:")
    if q_count and c_count:  # a generic "count" quantity takes any count noun, and vice versa
        return q_family == "count:count" or c_family == "count:count"
    return False


def unit_factor(quantity_unit: str, claim_unit: str) -> Fraction:
    """Factor f with ``value_in_claim_unit = value_in_quantity_unit / f``.

    E.g. ``unit_factor("bytes", "GB") == 10**9`` and ``unit_factor("fraction", "%") == 1/100``.
    Raises ConfigError (a ValueError) naming the argument when a unit is not a str, is
    unknown, or the two are of different families.
    """
    check_type("quantity_unit", quantity_unit, str, "must be a unit name (a str)")
    check_type("claim_unit", claim_unit, str, "must be a unit name (a str)")
    q = _parse_unit(quantity_unit) if quantity_unit != "any" else ("any", Fraction(1))
    c = _parse_unit(claim_unit)
    if q is None:
        raise ConfigError("quantity_unit", quantity_unit, "is not a known unit")
    if c is None:
        raise ConfigError("claim_unit", claim_unit, f"is not a known unit; known: {KNOWN_UNITS_HELP}")
    if quantity_unit == "any":  # not-checkable quantities take a figure in any unit
        return Fraction(1)
    q_family = _FAMILY_OF_QUANTITY_UNIT.get(quantity_unit, q[0])
    if not _compatible(q_family, c[0]):
        raise ConfigError("claim_unit", claim_unit, f"does not measure a quantity in {quantity_unit!r}")
    return c[1] / q[1]




# ----------------------------------------------------------------------------- bridges between families


@dataclass(frozen=True)
class UnitBridge:
    """A declared bridge between two unit families through one input of the claim: a value of
    ``per`` ``to`` units per ``frm`` unit, so ``value_in_to = value_in_frm x per`` (and back,
    ``value_in_frm = value_in_to / per``). ``frm`` and ``to`` are base units of their families."""

    frm: str
    to: str
    per: str
    description: str


#: the declared bridges: an element count printed in bytes (and a byte count printed in elements)
UNIT_BRIDGES: tuple[UnitBridge, ...] = (
    UnitBridge("elements", "bytes", "bytes_per_element",
               "elements x bytes_per_element = bytes (each communicated element takes bytes_per_element bytes, "
               "2 for bf16)"),
)


def bridge_between(quantity_unit: str, claim_unit: str) -> UnitBridge | None:
    """The declared bridge that lets a figure in ``claim_unit`` measure a quantity in
    ``quantity_unit`` when the two are of different families (either direction), else None.
    Raises ConfigError when an argument is not a str."""
    check_type("quantity_unit", quantity_unit, str, "must be a unit name (a str)")
    check_type("claim_unit", claim_unit, str, "must be a unit name (a str)")
    q, c = unit_family(quantity_unit), unit_family(claim_unit)
    if q is None or c is None:
        return None
    for b in UNIT_BRIDGES:
        ends = {unit_family(b.frm), unit_family(b.to)}
        if q != c and {q, c} == ends:
            return b
    return None


def bridged_factor(quantity_unit: str, claim_unit: str, per: Fraction) -> Fraction:
    """Factor f with ``value_in_claim_unit = value_in_quantity_unit / f`` across the declared bridge
    between the two units' families, ``per`` being the value of the bridge's input (e.g. 2 bytes per
    element: 10**9 elements are 2 GB, ``bridged_factor("elements", "GB", 2) == 10**9 / 2``). Raises
    ConfigError when no bridge joins the two units or ``per`` is not a positive number."""
    b = bridge_between(quantity_unit, claim_unit)
    if b is None:
        raise ConfigError("claim_unit", claim_unit, f"does not measure a quantity in {quantity_unit!r} "
                          "(no declared bridge joins the two families)")
    if isinstance(per, bool) or not isinstance(per, (int, Fraction)) or per <= 0:
        raise ConfigError(b.per, per, "must be a positive number to convert between units")
    if unit_family(quantity_unit) == unit_family(b.frm):
        return unit_factor(quantity_unit, b.frm) * unit_factor(b.to, claim_unit) / Fraction(per)
    return unit_factor(quantity_unit, b.to) * Fraction(per) * unit_factor(b.frm, claim_unit)


def factor_across(quantity_unit: str, claim_unit: str, values: Mapping[str, int | Fraction]) -> Fraction:
    """:func:`unit_factor`, or :func:`bridged_factor` across the declared bridge between the two
    units' families at ``values[bridge.per]`` (the claim's input values). Raises ConfigError when
    neither joins the units, or the bridge's input is not in ``values``."""
    try:
        return unit_factor(quantity_unit, claim_unit)
    except ConfigError:
        bridge = bridge_between(quantity_unit, claim_unit)
        per = None if bridge is None else values.get(bridge.per)
        if bridge is None or per is None:
            raise
        return bridged_factor(quantity_unit, claim_unit, Fraction(per))
