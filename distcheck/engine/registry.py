"""The property registry: :class:`Property`, :func:`register`, lookups and edge cases.

A property is a function ``fn(case, *, impl=None)`` that raises
:class:`distcheck.core.errors.PropertyFailure` when it does not hold. ``impl`` is the
implementation under test; ``None`` means the reference. Each parallelism package's
``properties`` module registers its properties with the strategy that feeds them and their
edge cases; :func:`properties` and :func:`get` import every such module first
(:mod:`distcheck.engine.discovery`).

A property's suite is the first part of its name (``"pp"`` for
``"pp.stash.formula"``); the suites are whatever the registered names start with
(:func:`suites`), not a list kept by hand.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import example
from hypothesis.strategies import SearchStrategy

from distcheck.core.errors import UnknownQuantityError
from distcheck.core.validate import check_choice
from distcheck.engine.discovery import import_package, role_modules

__all__ = ["Property", "register", "properties", "suites", "get", "with_edge_cases", "load"]

_REGISTRY: dict[str, Property] = {}
_loaded = False


def _no_edge_cases() -> Sequence[Any]:
    return ()


@dataclass(frozen=True)
class Property:
    """One registered property.

    Attributes:
        name: dotted name, e.g. ``"dp.unequal_shards.weighted"`` (suite first).
        strategy: a zero-argument callable returning the Hypothesis strategy of the
            cases (built lazily, so reference modules load only when needed).
        function: ``function(case, *, impl=None)``; raises PropertyFailure.
        description: one line: what must hold, and its exactness regime.
        reference: the default implementation (``impl=None``), for documentation.
        impl_signature: the signature an ``impl`` must have.
        edge_cases: a zero-argument callable returning the cases that are part of the
            property's definition: the boundaries of its domain where a wrong
            implementation shows (a tp that does not divide a width, m < p, dp that does
            not divide the parameters, a bias, GQA, tied embeddings ...). Every run tries
            them first, in order, before any generated case (as Hypothesis ``@example``s;
            :func:`with_edge_cases` adds them to your own ``@given`` test).
    """

    name: str
    strategy: Callable[[], SearchStrategy]
    function: Callable[..., None]
    description: str
    reference: Callable[..., Any] | None = field(default=None, repr=False)
    impl_signature: str = ""
    edge_cases: Callable[[], Sequence[Any]] = field(default=_no_edge_cases, repr=False)

    @property
    def suite(self) -> str:
        return self.name.split(".", 1)[0]

    def check(self, case: Any, impl: Callable[..., Any] | None = None, **options: Any) -> None:
        """Run the property on one case (raises PropertyFailure); ``options`` are keyword
        arguments of the property function (e.g. ``require_log=False``)."""
        if impl is None:
            self.function(case, **options)
        else:
            self.function(case, impl=impl, **options)


def register(prop: Property) -> Property:
    """Add ``prop`` to the registry; a second property of the same name is an error."""
    if prop.name in _REGISTRY and _REGISTRY[prop.name] is not prop:
        raise ValueError(f"property {prop.name!r} registered twice")
    _REGISTRY[prop.name] = prop
    return prop


def load() -> None:
    """Import every package's ``properties`` module once (they register themselves), then the
    rest of distcheck (:func:`~distcheck.engine.discovery.import_package`: the same Hypothesis
    constants in every run)."""
    global _loaded
    if not _loaded:
        role_modules("properties")
        import_package()
        _loaded = True


def suites() -> tuple[str, ...]:
    """The suites of the registered properties (the first part of each name), sorted."""
    load()
    return tuple(sorted({p.suite for p in _REGISTRY.values()}))


def properties(suite: str | None = None) -> list[Property]:
    """Registered properties, sorted by name; only those of ``suite`` when given.

    Raises ConfigError for an unknown suite.
    """
    load()
    if suite is not None:
        check_choice("suite", suite, suites())
    return [p for n, p in sorted(_REGISTRY.items()) if suite is None or p.suite == suite]


def get(name: str) -> Property:
    """The property called ``name``; raises UnknownQuantityError (a KeyError) with suggestions."""
    load()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownQuantityError(name, sorted(_REGISTRY), kind="property") from None


def with_edge_cases(prop: Property | str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: the property's edge cases as Hypothesis ``@example``s of a ``@given`` test.

    Use it above or below ``@given``::

        @with_edge_cases("tp.row.exact")
        @given(ds.linear_cases(max_tp=8))
        def test_my_row_parallel_layer(case):
            tp_props.row_exact(case, impl=my_row_parallel)

    The cases run first, in the order the property declares them.
    """
    if isinstance(prop, str):
        prop = get(prop)
    cases = tuple(prop.edge_cases())

    def decorate(test: Callable[..., Any]) -> Callable[..., Any]:
        # Hypothesis runs explicit examples last-applied first: apply them in reverse
        for case in reversed(cases):
            test = example(case)(test)
        return test

    return decorate
