"""Byte units. GB = 1e9 bytes (decimal, as the ZeRO paper and the lesson use);
GiB = 2**30 bytes (binary, as nvidia-smi and torch.cuda report).

Also the rates and times a step-time plan reads (:func:`parse_bandwidth`, :func:`parse_flop_rate`,
:func:`parse_seconds`): bandwidth in bytes per second (``"450 GB/s"``, GB/s = 1e9 bytes/s as
nccl-tests prints it; ``"400 Gb/s"`` in bits, a NIC's rating, is 50 GB/s), FLOP/s (``"989.5 TFLOP/s"``,
also written ``TFLOPS``: T = 1e12) and seconds (``"3.4 us"``)."""

from __future__ import annotations

import re
from decimal import Decimal
from fractions import Fraction

from distcheck.core.errors import ConfigError

__all__ = [
    "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB",
    "BYTE_UNITS", "MAX_SIZE_DIGITS", "bytes_to", "to_bytes", "parse_bytes", "format_bytes",
    "BANDWIDTH_UNITS", "FLOP_RATE_UNITS", "TIME_UNITS", "parse_bandwidth", "parse_flop_rate", "parse_seconds",
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


# ----------------------------------------------------------------------------------------------- rates and times

#: bandwidth unit -> bytes per second per unit (decimal GB/s as nccl-tests prints; Gb/s, a NIC's rating, in bits)
BANDWIDTH_UNITS: dict[str, Fraction] = {
    **{f"{u}/s": Fraction(v) for u, v in BYTE_UNITS.items() if u != "bytes"},
    "Gb/s": Fraction(10**9, 8), "Tb/s": Fraction(10**12, 8),
}
#: FLOP-rate unit -> FLOP/s per unit (T = 1e12, P = 1e15; ``TFLOPS`` is read as TFLOP/s)
FLOP_RATE_UNITS: dict[str, Fraction] = {
    **{f"{p}FLOP/s": Fraction(v) for p, v in (("", 1), ("G", 10**9), ("T", 10**12), ("P", 10**15))},
    **{f"{p}FLOPS": Fraction(v) for p, v in (("G", 10**9), ("T", 10**12), ("P", 10**15))},
}
#: time unit -> seconds per unit
TIME_UNITS: dict[str, Fraction] = {"s": Fraction(1), "ms": Fraction(1, 10**3), "us": Fraction(1, 10**6),
                                   "µs": Fraction(1, 10**6), "ns": Fraction(1, 10**9)}

_RATE = re.compile(r"^\s*([0-9][0-9_,]*(?:\.[0-9]+)?|\.[0-9]+)\s*(\S+)\s*$")


def _parse_with(field: str, text: object, units: dict[str, Fraction], example: str, *,
                allow_zero: bool = False) -> Fraction:
    if not isinstance(text, str):
        raise ConfigError(field, text, f"must be a string like {example!r}")
    match = _RATE.match(text)
    if not match or match.group(2) not in units:
        if re.match(r"^\s*-", text):
            raise ConfigError(field, text, f"must not be negative (a number with its unit, like {example!r})")
        raise ConfigError(field, text, f"must be a number followed by a unit ({', '.join(units)}), like {example!r}")
    number, unit = match.groups()
    digits = sum(ch.isdigit() for ch in number)
    if digits > MAX_SIZE_DIGITS:
        raise ConfigError(field, f"<a number of {digits:,} digits> {unit}",
                          f"must have at most {MAX_SIZE_DIGITS} digits")
    value = Fraction(number.replace("_", "").replace(",", "")) * units[unit]
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(field, text, "must be >= 0" if allow_zero else "must be > 0")
    return value


def parse_bandwidth(text: str, field: str = "bandwidth") -> Fraction:
    """Bytes per second in a bandwidth written with its unit, exactly: ``"450 GB/s"`` -> 450e9,
    ``"400 Gb/s"`` (bits) -> 50e9. Raises ConfigError naming ``field`` when it does not parse or is not > 0."""
    return _parse_with(field, text, BANDWIDTH_UNITS, "450 GB/s")


def parse_flop_rate(text: str, field: str = "peak_flops") -> Fraction:
    """FLOP/s in a rate written with its unit, exactly: ``"989.5 TFLOP/s"`` (or ``"989.5 TFLOPS"``) ->
    989.5e12. Raises ConfigError naming ``field`` when it does not parse or is not > 0."""
    return _parse_with(field, text, FLOP_RATE_UNITS, "989.5 TFLOP/s")


def parse_seconds(text: str, field: str = "time", *, allow_zero: bool = False) -> Fraction:
    """Seconds in a time written with its unit, exactly: ``"3.4 us"`` -> 17/5000000.
    Raises ConfigError naming ``field`` when it does not parse, or is not > 0 (>= 0 with ``allow_zero``)."""
    return _parse_with(field, text, TIME_UNITS, "3.4 us", allow_zero=allow_zero)
