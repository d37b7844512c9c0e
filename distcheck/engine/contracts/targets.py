"""Targets: the user's object named ``module:object``, found again on every rank.

A target travels to the ranks as a :class:`Target`: its reference (``module:qualname``)
when that imports back to the same object, else the object pickled by value (a
``ColwiseParallel(...)`` instance built in a test). A rank resolves it once and keeps
it (:func:`resolve`). Forked ranks find modules the parent imported in ``sys.modules``;
spawned ranks (NCCL) import them, so the target's module must be importable there.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import pickle
import sys
from dataclasses import dataclass, field
from typing import Any

from distcheck.engine.contracts.errors import ProtocolError, TargetError

__all__ = ["Target", "import_target", "from_signal", "reference_of", "make_target", "describe", "resolve",
           "package_version", "distribution_version", "require_distribution", "check_call_shape", "built_on_first_use"]


@dataclass(frozen=True)
class Target:
    """What every rank needs to find the user's object and build it under the contract.

    Attributes:
        ref: ``module:qualname`` (shown in reports and in the command that reproduces a failure).
        kind: how the contract builds it (``"module"``, ``"style"``, ``"plan"``, ``"factory"``, ...).
        pickled: the object pickled by value when ``ref`` does not import back to it, else None.
        build: contract-specific, picklable settings of the build (constructor keywords, split convention ...).
    """

    ref: str
    kind: str
    pickled: bytes | None = None
    build: dict = field(default_factory=dict)


def import_target(text: str) -> tuple[Any, str]:
    """Import ``"package.module:attr.path"`` and return ``(object, text)``.

    Raises TargetError (a ConfigError) naming the target: no colon, a module that cannot be
    imported (with the import error's message), or a missing attribute. Whatever the module's code
    raises while it is imported or its attribute is looked up (a module ``__getattr__``) is the
    target's failure, ``SystemExit`` (``sys.exit(0)`` at import), ``KeyboardInterrupt`` and any other
    ``BaseException`` included; only a real Ctrl-C or SIGTERM (:func:`from_signal`) goes through.
    """
    if not isinstance(text, str) or text.count(":") != 1 or not all(text.split(":")):
        raise TargetError("target", text, "must be 'module:object' (e.g. mypkg.layers:MyColumnParallel)")
    module_name, attr = text.split(":")
    missing = object()
    try:
        obj: Any = importlib.import_module(module_name)
    except BaseException as exc:  # any import failure is bad input, reported in one line
        if from_signal(exc):  # Ctrl-C or SIGTERM while importing: the run is interrupted, not the target bad
            raise
        raise TargetError("target", text, f"cannot be imported: {_user_failure(exc, 'imported')}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part, missing)
        except BaseException as exc:  # the module's __getattr__ (or a property) raised
            if from_signal(exc):
                raise
            raise TargetError("target", text, f"cannot be looked up: {_user_failure(exc, 'looked up')}") from None
        if obj is missing:
            raise TargetError("target", text, f"names no object: {module_name} has no attribute {attr!r}")
    return obj, text


def _user_failure(exc: BaseException, doing: str) -> str:
    """``Type: first line`` of what the target's code raised while it was ``doing`` (imported, looked up);
    a ``SystemExit`` or another exception that is not an ``Exception`` (``KeyboardInterrupt``, a
    ``BaseException`` of its own) says so."""
    if isinstance(exc, SystemExit):
        return f"SystemExit({exc.code!r}): its code calls sys.exit while it is {doing}"
    first = str(exc).splitlines()[0] if str(exc) else ""
    text = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return text if isinstance(exc, Exception) else f"{text} (raised while it is {doing})"


def from_signal(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by a Python signal handler installed for SIGINT or SIGTERM (the command
    line's: a real Ctrl-C or SIGTERM), rather than by the code that was running.

    The handler's own frame is then the innermost of the traceback. A ``SystemExit``, a
    ``KeyboardInterrupt`` or any other ``BaseException`` that a target raises itself (``sys.exit(0)`` at
    import) is the target's doing: a bad target or a failure, never the end of the run. Under the default
    SIGINT handler (written in C, no frame) a Ctrl-C cannot be told apart from the target's own
    ``raise KeyboardInterrupt``; both are then the target's."""
    import signal

    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    handlers = {getattr(signal.getsignal(s), "__code__", None) for s in (signal.SIGINT, signal.SIGTERM)} - {None}
    return tb.tb_frame.f_code in handlers


def reference_of(obj: Any) -> str | None:
    """``module:qualname`` of ``obj`` when importing it gives ``obj`` back, else None."""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not module or not qualname or "<locals>" in qualname:
        return None
    found: Any = sys.modules.get(module)
    if found is None:
        return None
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return f"{module}:{qualname}" if found is obj else None


def make_target(obj: Any, ref: str | None, kind: str, **build: Any) -> Target:
    """A :class:`Target` for ``obj``: by reference when it imports back, else pickled by value.

    Raises TargetError when ``obj`` can be neither (a class defined inside a function).
    """
    own = reference_of(obj)
    if ref is not None and own is None:  # e.g. an instance named by a module attribute
        try:
            if import_target(ref)[0] is obj:
                own = ref
        except TargetError:
            pass
    if own is not None:
        return Target(ref=ref or own, kind=kind, build=build)
    try:
        data = pickle.dumps(obj)
    except Exception as exc:  # noqa: BLE001
        raise TargetError("target", repr(obj), f"must be importable as module:object or picklable ({exc})") from None
    return Target(ref=ref or describe(obj), kind=kind, pickled=data, build=build)


def describe(obj: Any) -> str:
    """A short name for an object that has no ``module:object`` name (shown in reports)."""
    if isinstance(obj, dict):
        return "{" + ", ".join(f"{k!r}: {type(v).__name__}" for k, v in obj.items()) + "}"
    return f"{type(obj).__qualname__}(...)"


_RESOLVED: dict[tuple, Any] = {}


def resolve(target: Target) -> Any:
    """The object of ``target`` in this process (imported or unpickled once, then cached)."""
    key = (target.ref, target.pickled)
    if key not in _RESOLVED:
        if target.pickled is not None:
            _RESOLVED[key] = pickle.loads(target.pickled)
        else:
            _RESOLVED[key] = import_target(target.ref)[0]
    return _RESOLVED[key]


def package_version(ref: str) -> tuple[str | None, str | None]:
    """``(distribution, version)`` of the installed distribution that provides ``ref``'s top-level
    package (``importlib.metadata.packages_distributions``), or ``(None, None)`` when none does
    (a module of the current checkout)."""
    top = ref.split(":")[0].split(".")[0]
    try:
        dists = importlib.metadata.packages_distributions().get(top) or []
    except Exception:  # noqa: BLE001 - metadata of broken installs
        dists = []
    for dist in dists:
        try:
            return dist, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None, None


def distribution_version(dist: str) -> str | None:
    """The installed version of distribution ``dist`` (``"deepspeed"``), None when it is not installed."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def require_distribution(ref: str, dist: str | None) -> None:
    """Raise TargetError when ``dist`` (the library a target wraps) is not installed: bad input, not a
    failure of every property. Nothing to check when ``dist`` is None (code of the current checkout)."""
    if dist is not None and distribution_version(dist) is None:
        raise TargetError("target", ref, f"wraps {dist}, which is not installed (pip install {dist}, or the libs "
                                         "extra: pip install 'distcheck[libs]')")


def check_call_shape(obj: Any, shown: str, rule: str, nargs: int = 2) -> None:
    """Raise ``ProtocolError("target", shown, rule)`` unless ``obj`` can be called with ``nargs`` positional
    arguments (a factory ``make(ctx, case)``, a loss ``fn(logits, target)``). An object with no readable
    signature (a C extension) is accepted here and tried on the ranks."""
    import inspect

    try:
        inspect.signature(obj).bind(*([None] * nargs))
    except TypeError:
        raise ProtocolError("target", shown, rule) from None
    except ValueError:
        pass


def built_on_first_use(module_name: str, builders: dict[str, Any]) -> tuple[Any, Any]:
    """A module's ``(__getattr__, __dir__)`` for names built on first use (torch's parallel plans, which
    import torch): ``builders`` maps each name to a function of no arguments; the object it builds is kept,
    so a name gives the same object every time, and a target named ``module:NAME`` is found again on every
    rank. Any other name raises AttributeError, as a module does."""
    built: dict[str, Any] = {}

    def __getattr__(name: str) -> Any:
        if name in builders:
            if name not in built:
                built[name] = builders[name]()
            return built[name]
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(builders)

    return __getattr__, __dir__
