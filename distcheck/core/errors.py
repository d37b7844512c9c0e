"""One exception hierarchy for distcheck.

Every error raised for bad user input is a :class:`ConfigError` (a ``ValueError``)
whose message names the field, its value and the rule it breaks, e.g.::

    ConfigError("tp", 3, "must divide num_kv_heads=8")
    -> "tp=3 must divide num_kv_heads=8"

Never ``assert`` for validation: asserts vanish under ``python -O``. The checks that
raise these errors live in one module, :mod:`distcheck.core.validate`.

Every exception here survives ``pickle`` with all its fields (``args``, every
attribute and any ``__notes__``): a rank's error crosses a process boundary
intact. :meth:`DistcheckError.__reduce__` rebuilds the object without calling
``__init__`` again, so subclasses need no pickling code of their own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "DistcheckError",
    "ConfigError",
    "IntervalError",
    "UnknownQuantityError",
    "GoldenError",
    "AnswerKeyError",
    "PropertyFailure",
    "ImplementationError",
    "DistributedError",
    "RankFailure",
    "WorldTimeout",
    "BackendUnavailable",
]


class DistcheckError(Exception):
    """Base class of every error distcheck raises on purpose."""

    def __reduce__(self) -> tuple[Any, ...]:
        # (class, args, every attribute): the copy equals the original field for field
        return (_restore, (type(self), self.args, dict(self.__dict__)))


def _restore(cls: type[DistcheckError], args: tuple, state: dict[str, Any]) -> DistcheckError:
    """Unpickle a :class:`DistcheckError` without running its ``__init__`` again."""
    err = cls.__new__(cls, *args)
    err.args = args
    err.__dict__.update(state)
    return err


class ConfigError(DistcheckError, ValueError):
    """A configuration value breaks a rule.

    Attributes: ``field`` (the argument or config field name), ``value`` (what was
    given) and ``rule`` (the rule it breaks, phrased to follow ``field=value``).
    """

    def __init__(self, field: str, value: object, rule: str):
        self.field = field
        self.value = value
        self.rule = rule
        super().__init__(f"{field}={_show(value)} {rule}")


def _show(value: object) -> str:
    """A value as a user wrote it: ``3/2`` for a Fraction, ``5`` for an integral one, an integer of more than
    30 digits in scientific notation (``1.000000e+400``: the message stays one line), else ``repr``."""
    from decimal import Decimal
    from fractions import Fraction

    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return format(Decimal(value), ".6e")
    if isinstance(value, Fraction):
        return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
    return repr(value)


class IntervalError(ConfigError):
    """The upper end of a ``min_*``/``max_*`` pair is below its lower end.

    A :class:`ConfigError` naming the upper end (``field``, ``value``; ``rule`` is
    ``"must be >= min_tp=2"``) whose message is worded as Hypothesis words it for its own
    strategies: ``Cannot have max_tp=1 < min_tp=2``.
    """

    def __init__(self, low_field: str, low: object, high_field: str, high: object):
        super().__init__(high_field, high, f"must be >= {low_field}={_show(low)}")
        self.args = (f"Cannot have {high_field}={_show(high)} < {low_field}={_show(low)}",)


class UnknownQuantityError(DistcheckError, KeyError):
    """A name is not in a catalogue (closed forms, auditable quantities, properties).

    ``kind`` says which: ``"quantity"`` (default) or ``"property"``; the message
    suggests close matches (:func:`difflib.get_close_matches`). ``where`` leads the
    message (the file and entry that gave the name, ending in ``": "``); ``list_known``
    names every known one too (``(known: a, b)``, or ``(there are none)``).
    """

    def __init__(self, name: str, known: list[str] | None = None, kind: str = "quantity", *, where: str = "",
                 list_known: bool = False):
        self.name = name
        self.kind = kind
        self.known = known or []
        self.where = where
        hint = ""
        if self.known:
            import difflib

            close = difflib.get_close_matches(name, self.known, n=3)
            if close:
                hint = f"; did you mean {', '.join(close)}?"
        if list_known:
            hint += f" (known: {', '.join(self.known)})" if self.known else " (there are none)"
        super().__init__(f"{where}unknown {kind} {name!r}{hint}")

    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return str(self.args[0])


class GoldenError(DistcheckError):
    """A golden record is malformed or does not reproduce."""


class AnswerKeyError(DistcheckError):
    """An answer key is malformed: names the file, line (when known) and field."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None, field: str | None = None):
        self.path, self.line, self.field = path, line, field
        where = ":".join(str(x) for x in (path, line) if x is not None)
        prefix = f"{where}: " if where else ""
        fld = f"[{field}] " if field else ""
        super().__init__(f"{prefix}{fld}{message}")


class PropertyFailure(DistcheckError, AssertionError):
    """A property does not hold: carries expected, got, max error and the bound.

    ``kind`` is ``"claim"``: the property's own claim (values, bounds, counts) is false.
    The subclass :class:`ImplementationError` says instead that the implementation
    under test could not be checked (it raised, or breaks the slot's contract).
    """

    kind = "claim"

    def __init__(self, message: str, *, expected: Any = None, got: Any = None, max_error: float | None = None,
                 bound: float | None = None):
        self.expected, self.got, self.max_error, self.bound = expected, got, max_error, bound
        parts = [message]
        if max_error is not None:
            parts.append(f"max error {max_error:.3e}" + (f" > bound {bound:.3e}" if bound is not None else ""))
        if expected is not None:
            parts.append(f"expected {expected!r}")
        if got is not None:
            parts.append(f"got {got!r}")
        super().__init__("; ".join(parts))


class ImplementationError(PropertyFailure):
    """The implementation under test could not be checked on a valid case.

    ``kind``: ``"raised"`` (it raised; ``error_type`` names the exception) or
    ``"contract"`` (it breaks the slot's contract, e.g. takes no ``log=`` where the
    property's collective count needs one). For a user's implementation this fails
    the property like a wrong value does; a mutant that fails this way is *broken*,
    not killed (:func:`distcheck.mutants.kill_mutant`).
    """

    def __init__(self, message: str, kind: str = "raised", error_type: str | None = None):
        if kind not in ("raised", "contract"):
            raise ValueError(f"kind={kind!r} must be 'raised' or 'contract'")
        self.kind = kind
        self.error_type = error_type
        super().__init__(message)


class DistributedError(DistcheckError):
    """Base class of failures of a multi-process world."""


class RankFailure(DistributedError):
    """A rank raised or died.

    Attributes: ``rank`` (the rank reported: the lowest that died, else the
    lowest that raised), ``traceback_text`` (its traceback, or how it died) and
    ``failures`` (every failed rank -> its text; default ``{rank: traceback_text}``).
    ``str()`` starts with ``rank <rank> failed:``.
    """

    def __init__(self, rank: int, traceback_text: str, failures: Mapping[int, str] | None = None):
        self.rank = rank
        self.traceback_text = traceback_text
        self.failures: dict[int, str] = dict(failures) if failures else {rank: traceback_text}
        super().__init__(f"rank {rank} failed:\n{traceback_text}")


class WorldTimeout(DistributedError):
    """A step did not finish within its timeout; carries the stuck ranks and their stacks.

    Attributes: ``ranks`` (sorted), ``stacks`` (rank -> Python stack text) and
    ``timeout_s`` (seconds).
    """

    def __init__(self, message: str, ranks: list[int] | None = None, stacks: Mapping[int, str] | None = None,
                 timeout_s: float | None = None):
        self.ranks: list[int] = list(ranks or [])
        self.stacks: dict[int, str] = dict(stacks or {})
        self.timeout_s = timeout_s
        super().__init__(message)


class BackendUnavailable(DistributedError):
    """The requested backend (e.g. NCCL without a GPU) cannot run here."""
