"""Byte units. GB = 1e9 bytes (decimal, as the ZeRO paper and the lesson use);
GiB = 2**30 bytes (binary, as nvidia-smi and torch.cuda report)."""

from __future__ import annotations

from fractions import Fraction

from distcheck.errors import ConfigError

__all__ = ["KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB", "BYTE_UNITS", "bytes_to", "to_bytes"]

KB, MB, GB, TB = 10**3, 10**6, 10**9, 10**12
KiB, MiB, GiB, TiB = 2**10, 2**20, 2**30, 2**40

#: unit name -> bytes per unit
BYTE_UNITS: dict[str, int] = {
    "bytes": 1, "B": 1,
    "KB": KB, "MB": MB, "GB": GB, "TB": TB,
    "KiB": KiB, "MiB": MiB, "GiB": GiB, "TiB": TiB,
}


def _unit(unit: str) -> int:
    try:
        return BYTE_UNITS[unit]
    except KeyError:
        raise ConfigError("unit", unit, f"must be one of {', '.join(BYTE_UNITS)}") from None


def bytes_to(n_bytes, unit: str):
    """Convert a byte count to ``unit`` (exact: returns a Fraction when not integral).

    >>> float(bytes_to(107_810_390_016, "GB"))
    107.810390016
    """
    value = Fraction(n_bytes) / _unit(unit)
    return int(value) if value.denominator == 1 else value


def to_bytes(value, unit: str):
    """Convert ``value`` in ``unit`` to bytes (exact)."""
    out = Fraction(value) * _unit(unit)
    return int(out) if out.denominator == 1 else out
