"""distcheck's properties: the public path of the property engine and of the suites.

A property is a function ``fn(case, *, impl=None)`` that raises
:class:`distcheck.core.errors.PropertyFailure` when it does not hold. ``impl`` is the
implementation under test; ``None`` means the reference (``distcheck.parallel.dp``,
``distcheck.parallel.tp``, ...). Passing another function with the same signature is how a
mutant (:mod:`distcheck.mutants`) or a third-party layer is checked.

Each property is registered with the strategy that feeds it and its edge cases as a
:class:`Property`. :func:`run_property` applies :func:`hypothesis.given` itself, so
properties run without pytest (``distcheck check``): the edge cases first, then the
generated cases, seeded from the run seed (:func:`resolve_seed`, :func:`example_seed`), so
the same profile and seed give the same row. It returns a :class:`distcheck.core.results.CheckResult`
row (backend ``"reference"``) with the examples tried, the verdict, and on failure the
reason, the shrunk counterexample and how to reproduce it (the seed, and the
``@reproduce_failure`` blob).

Where things live: the engine is :mod:`distcheck.engine` (registry, runner, mutants,
proofs); each suite's properties are in its parallelism package (``distcheck/parallel/<name>/``,
internal modules), found by discovery. This module is their public path: a property is reached by
its registered name, ``get("tp.row.exact").check(case, impl=my_layer)`` (names are unique; function
names are not: ``mlp_exact`` is a tp and an sp property), and the proofs by :func:`prove`,
:func:`prove_all` and :data:`PROOFS`. It is the one path of each property: there is no module
per suite.

Importing this package loads the closed-form catalogue (sympy and every package's forms,
about a second). The cost is paid once, at import (test collection), not inside the first
example of a user's ``@given`` test, where it would exceed Hypothesis' default 200 ms
deadline (DeadlineExceeded, then FlakyFailure when the replay is fast). After that a
property evaluates its closed forms in about a millisecond.
"""

from typing import Any

from distcheck.engine.catalogue import form_value
from distcheck.engine.mutants import mutant_summary
from distcheck.engine.proofs import prove, prove_all

# _REGISTRY: the registry itself (name -> Property), for a test that swaps one property
from distcheck.engine.registry import _REGISTRY as _REGISTRY
from distcheck.engine.registry import Property, get, properties, register, suites, with_edge_cases
from distcheck.engine.run import run_all
from distcheck.engine.runner import (
    DETAIL_CHARS,
    REASON_CHARS,
    call_impl,
    example_seed,
    failure_detail,
    failure_kind,
    resolve_seed,
    run_property,
    run_suite,
)

__all__ = [
    "Property",
    "register",
    "properties",
    "suites",
    "get",
    "run_property",
    "run_suite",
    "with_edge_cases",
    "resolve_seed",
    "example_seed",
    "run_all",
    "mutant_summary",
    "call_impl",
    "failure_detail",
    "failure_kind",
    "form_value",
    "REASON_CHARS",
    "DETAIL_CHARS",
    "prove",
    "prove_all",
    "PROOFS",
]


def __getattr__(name: str) -> Any:
    """:data:`PROOFS`: every registered proof by name (``name -> function``), every package's proofs loaded
    on first access."""
    if name == "PROOFS":
        from distcheck.engine import proofs

        proofs.load()
        return proofs.PROOFS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
