"""The small world-free test contract of the certify tests: ``f(a, b) == a + b`` and symmetry, with
a correct and a known-wrong adder. One definition, subclassed (a name and dtypes of its own) by the
modules that need a variant; a contract with a name registers itself once, so it cannot be copied."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from distcheck.engine.contracts.contract import Contract, Outcome, PropertySpec
from distcheck.engine.contracts.errors import ProtocolError
from distcheck.engine.contracts.targets import make_target


@dataclass(frozen=True)
class Pair:
    a: int
    b: int


def good_add(a, b):
    return a + b


def add_without_carry(a, b):  # wrong once a sum reaches 16
    return (a + b) % 16


class AdditionContract(Contract):
    """A world-free contract (as memory estimators and rank layouts will be): ``f(a, b) == a + b``,
    and ``f`` is symmetric."""

    name = "test-addition"
    min_world_size = 1
    min_world_reason = "runs in this process: the sums are drawn, whatever the world"
    parallelism = "test"
    summary = "adds"
    needs_world = False
    dtypes = ("float64",)
    properties = (PropertySpec("sum", "f(a, b) == a + b", "exact"),
                  PropertySpec("symmetric", "f(a, b) == f(b, a)", "exact"))

    def resolve(self, obj, ref, options):
        if not callable(obj):
            raise ProtocolError("target", repr(obj), "must be callable")
        return make_target(obj, ref, "function"), options

    def cases(self, world_size, dtype, options):
        return st.builds(Pair, st.integers(0, 20), st.integers(0, 20))

    def run_rank(self, ctx, target, case, dtype, options):
        from distcheck.engine.contracts.targets import resolve

        f = resolve(target)
        return f(case.a, case.b), f(case.b, case.a)

    def check(self, case, results, world_size, dtype, options):
        got, swapped = results[0]
        return {"sum": Outcome(got == case.a + case.b, message=f"f({case.a}, {case.b}) = {got}"),
                "symmetric": Outcome(got == swapped, message=f"{got} != {swapped}")}
