"""distcheck's properties: the public path of the property engine and of the suites.

A property is a function ``fn(case, *, impl=None)`` that raises
:class:`distcheck.errors.PropertyFailure` when it does not hold. ``impl`` is the
implementation under test; ``None`` means the reference (``distcheck.dp``,
``distcheck.tp``, ...). Passing another function with the same signature is how a
mutant (:mod:`distcheck.mutants`) or a third-party layer is checked.

Each property is registered with the strategy that feeds it and its edge cases as a
:class:`Property`. :func:`run_property` applies :func:`hypothesis.given` itself, so
properties run without pytest (``distcheck check``): the edge cases first, then the
generated cases, seeded from the run seed (:func:`resolve_seed`, :func:`example_seed`), so
the same profile and seed give the same row. It returns a :class:`distcheck.report.CheckResult`
row (backend ``"reference"``) with the examples tried, the verdict, and on failure the
reason, the shrunk counterexample and how to reproduce it (the seed, and the
``@reproduce_failure`` blob).

Where things live: the engine is :mod:`distcheck.engine` (registry, runner, mutants,
proofs); each suite's properties are in its parallelism package,
``distcheck/parallel/<name>/properties.py``, found by discovery. This package re-exports
the engine's API, and its modules ``distcheck.props.<suite>`` (dp, accumulation, tp,
pipeline, zero, params, layout, comm, proofs) re-export those suites' property functions
under the names they have always had: ``from distcheck.props import tp as tp_props``. A
suite added later is reached as ``distcheck.parallel.<name>.properties``; its properties
are registered, run and listed here without any edit.

Importing this package loads the closed-form catalogue (sympy and every package's forms,
about a second). The cost is paid once, at import (test collection), not inside the first
example of a user's ``@given`` test, where it would exceed Hypothesis' default 200 ms
deadline (DeadlineExceeded, then FlakyFailure when the replay is fast). After that a
property evaluates its closed forms in about a millisecond.
"""

from distcheck.engine.catalogue import form_value
from distcheck.engine.mutants import mutant_summary

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
]
