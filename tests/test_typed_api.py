"""Every public function of distcheck is fully annotated.

Public means named in a module's ``__all__``, or a public method (not ``_``-prefixed) of a class that
``__all__`` names. Each such callable must annotate every parameter (``self``/``cls`` aside) and its
return. Each definition is checked once, in the module that defines it (a face or a catalogue that
re-exports a name does not check it again). Modules whose import fails on a missing optional
dependency are skipped. mypy's ``disallow_untyped_defs`` in pyproject.toml holds all of distcheck to the
same rule, private functions included.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import distcheck

#: the packages held to the rule: all of distcheck (mypy's disallow_untyped_defs in pyproject.toml holds it too,
#: private functions included)
TYPED: tuple[str, ...] = ("distcheck",)


#: public callables typed by a type comment instead of their signature, each with the reason (mypy reads the
#: comment, so ``disallow_untyped_defs`` still holds them)
TYPE_COMMENTED: dict[str, str] = {
    "distcheck.parallel.dp.ddp.weighted_allreduce_hook": "torch's register_comm_hook rejects a hook whose bucket or "
    "return annotation is not the object dist.GradBucket / Future[Tensor]; the module imports torch lazily",
}


def _modules() -> Iterator[ModuleType]:
    for info in pkgutil.walk_packages(distcheck.__path__, prefix="distcheck.", onerror=lambda _name: None):
        if not info.name.startswith(TYPED) or info.name.endswith(".__main__"):  # __main__ runs the CLI
            continue
        try:
            yield importlib.import_module(info.name)
        except ImportError as e:  # an optional dependency that is not installed (never a module of distcheck)
            if (e.name or "").partition(".")[0] == "distcheck":
                raise
            continue


def _callables(module: ModuleType) -> Iterator[tuple[str, Callable[..., Any]]]:
    for name in vars(module).get("__all__", ()):
        obj = getattr(module, name, None)
        if getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(obj):
            yield f"{module.__name__}.{name}", obj
        elif inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if attr.startswith("_"):
                    continue
                if isinstance(member, (staticmethod, classmethod)):
                    member = member.__func__
                elif isinstance(member, property):
                    member = member.fget
                if inspect.isfunction(member):
                    yield f"{module.__name__}.{name}.{attr}", member


def _missing(func: Callable[..., Any]) -> list[str]:
    signature = inspect.signature(func)
    missing = [p.name for i, p in enumerate(signature.parameters.values())
               if p.annotation is inspect.Parameter.empty and not (i == 0 and p.name in ("self", "cls"))]
    if signature.return_annotation is inspect.Signature.empty:
        missing.append("return")
    return missing


def offenders() -> list[str]:
    """``module.name: missing annotations`` for each public callable of :data:`TYPED` that lacks any."""
    found: set[str] = set()
    for module in _modules():
        for path, func in _callables(module):
            if path in TYPE_COMMENTED and "# type: (" in inspect.getsource(func).partition("\n")[0]:
                continue
            missing = _missing(func)
            if missing:
                found.add(f"{path}: {', '.join(missing)}")
    return sorted(found)


def test_the_checker_sees_a_missing_annotation() -> None:
    def untyped(a, b: int):  # type: ignore[no-untyped-def]
        return a

    def typed(a: int, *rest: str, key: float = 1.0) -> int:
        return a

    assert _missing(untyped) == ["a", "return"]
    assert _missing(typed) == []


def test_the_checker_walks_the_typed_packages() -> None:
    names = {m.__name__ for m in _modules()}
    assert all(n.startswith(TYPED) for n in names)
    assert all(any(n.startswith(p) for n in names) for p in TYPED)
    assert sum(1 for m in _modules() for _ in _callables(m)) > 0


def test_every_public_function_is_annotated() -> None:
    bad = offenders()
    assert not bad, f"{len(bad)} public callables lack annotations:\n" + "\n".join(bad)
