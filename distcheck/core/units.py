"""Byte units. GB = 1e9 bytes (decimal, as the ZeRO paper and the lesson use);
GiB = 2**30 bytes (binary, as nvidia-smi and torch.cuda report)."""

from __future__ import annotations

import re
from decimal import Decimal
from fractions import Fraction

from distcheck.core.errors import ConfigError

__all__ = [
    "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB",
    "BYTE_UNITS", "MAX_SIZE_DIGITS", "bytes_to", "to_bytes", "parse_bytes", "format_bytes",
]

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


def bytes_to(n_bytes: int | float | Fraction | Decimal, unit: str) -> int | Fraction:
    """Convert a byte count to ``unit`` (exact: returns a Fraction when not integral).

    ``unit`` is a key of :data:`BYTE_UNITS`: decimal ``KB/MB/GB/TB`` (powers of
    1000) or binary ``KiB/MiB/GiB/TiB`` (powers of 1024). Raises ConfigError for
    any other unit (units are case-sensitive).

    >>> float(bytes_to(107_810_390_016, "GB"))
    107.810390016
    """
    value = Fraction(n_bytes) / _unit(unit)
    return int(value) if value.denominator == 1 else value


def to_bytes(value: int | float | Fraction | Decimal, unit: str) -> int | Fraction:
    """Convert ``value`` in ``unit`` to bytes (exact): ``to_bytes(80, "GiB") == 85_899_345_920``.

    Returns an int, or a Fraction when the result is not a whole number of
    bytes. Raises ConfigError for an unknown unit (see :func:`bytes_to`).
    """
    out = Fraction(value) * _unit(unit)
    return int(out) if out.denominator == 1 else out


#: the most digits the number of a size may have (integer and fractional parts together): a byte count of
#: 40 digits is 10**22 times all the memory ever built; longer text is a typo (and Python refuses to read
#: an integer of more than 4300 digits)
MAX_SIZE_DIGITS = 40

_QUANTITY = re.compile(r"^\s*([0-9][0-9_,]*(?:\.[0-9]+)?|\.[0-9]+)\s*([A-Za-z]+)\s*$")


def parse_bytes(text: str) -> int | Fraction:
    """Bytes in a size written with its unit, exactly: ``"80 GB"`` -> 80_000_000_000,
    ``"80 GiB"`` -> 85_899_345_920, ``"1.5 KiB"`` -> 1536.

    The unit is required and must be one of :data:`BYTE_UNITS` (case-sensitive:
    GB = 1e9 and GiB = 2**30 are different units). The number is a plain
    decimal (``_`` or ``,`` thousands separators allowed), parsed exactly, so
    ``"0.1 GB"`` is exactly 100,000,000 bytes. Returns an int, or a Fraction
    when the product is not a whole number of bytes.

    Raises ConfigError naming the text and the rule when it does not parse, or when its number has
    more than :data:`MAX_SIZE_DIGITS` digits.
    """
    if not isinstance(text, str):
        raise ConfigError("size", text, "must be a string like '80 GB' or '80 GiB'")
    match = _QUANTITY.match(text)
    if not match:
        if re.match(r"^\s*-", text):
            raise ConfigError("size", text, "must not be negative (a number of bytes with its unit, like '80 GB')")
        raise ConfigError("size", text, "must be a number followed by a unit, like '80 GB' or '80 GiB'")
    number, unit = match.groups()
    digits = sum(ch.isdigit() for ch in number)
    if digits > MAX_SIZE_DIGITS:
        raise ConfigError("size", f"<a number of {digits:,} digits> {unit}",
                          f"must have at most {MAX_SIZE_DIGITS} digits (a size needs far fewer)")
    return to_bytes(Fraction(number.replace("_", "").replace(",", "")), unit)


def format_bytes(n_bytes: int | float | Fraction | Decimal, unit: str = "GB", digits: int = 2) -> str:
    """``n_bytes`` in ``unit``, rounded half-even to ``digits`` decimals, with the unit named.

    >>> format_bytes(107_810_390_016)
    '107.81 GB'
    >>> format_bytes(107_810_390_016, "GiB")
    '100.41 GiB'

    The rounding is done on the exact value (no float step). Raises ConfigError
    for an unknown unit or ``digits`` not an integer >= 0.
    """
    if isinstance(digits, bool) or not isinstance(digits, int) or digits < 0:
        raise ConfigError("digits", digits, "must be an integer >= 0")
    value = Fraction(n_bytes) / _unit(unit)
    scaled = round(value * 10**digits)  # Fraction.__round__: exact, half to even
    sign = "-" if scaled < 0 else ""
    whole, frac = divmod(abs(scaled), 10**digits)
    text = f"{whole:,}" + (f".{frac:0{digits}d}" if digits else "")
    return f"{sign}{text} {unit}"
