"""The rank-layout contract: a target's rank groups against distcheck's layout for the same order.

A :class:`LayoutTarget` gives, for a configuration drawn by Hypothesis, the rank
groups of each of its axes (or of several axes at once: ``tp-pp``, ``dp-cp``),
keyed by the target's own names. distcheck computes the same groups from its
references for the same order (:mod:`distcheck.layout` for the single tp, cp,
pp, dp axes and ep carved from dp*cp; :mod:`distcheck.mesh_layout` for foreign
axes, split dp, borrowed ep and multi-axis groups). Groups are compared as
sets of sets: each group sorted, the groups sorted by first rank (a process
group's ranks are numbered in ascending order, whatever order they are listed in).

:func:`check_layout` returns one :class:`distcheck.report.CheckResult` row,
``libs.<name>.groups``: ``pass`` naming the configurations and axes compared, or
``FAIL`` with the smallest configuration Hypothesis found and the first axis
whose groups differ, both listed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from hypothesis import strategies as st

from distcheck.libs.search import falsify
from distcheck.report import FAIL, PASS, CheckResult
from distcheck.validate import check_callable, check_type

__all__ = ["LayoutTarget", "canonical", "check_layout", "LAYOUT_EXAMPLES"]

#: configurations per layout check (each one may build a device mesh)
LAYOUT_EXAMPLES = 40

Groups = Mapping[str, list[list[int]]]


def canonical(groups) -> list[list[int]]:
    """Groups as sorted lists of ints, sorted by first rank (the order ranks are numbered in)."""
    return sorted(sorted(int(r) for r in g) for g in groups)


@dataclass(frozen=True)
class LayoutTarget:
    """A target of the rank-layout contract.

    Attributes:
        name: check prefix, e.g. ``"megatron.rank_generator"``.
        library: distribution and version, e.g. ``"megatron-core 0.16.1"``.
        configs: strategy of configurations (dicts) to draw.
        groups: ``config -> {axis token: groups}``: what the target builds.
        reference: ``config -> {axis token: groups}``: what distcheck's layout says, for at least
            every token the target gives.
        order: ``config -> order string`` shown in a counterexample (innermost first).
    """

    name: str
    library: str
    configs: st.SearchStrategy
    groups: Callable[[dict], Groups]
    reference: Callable[[dict], Groups]
    order: Callable[[dict], str]

    def __post_init__(self) -> None:
        check_type("name", self.name, str, "must be a check name such as 'megatron.rank_generator'")
        check_type("configs", self.configs, st.SearchStrategy, "must be a Hypothesis strategy of configs")
        for f in ("groups", "reference", "order"):
            check_callable(f, getattr(self, f))


def _first_difference(a: list[list[int]], b: list[list[int]]) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"group {i}: {x} vs {y}"
    return f"{len(a)} groups vs {len(b)}"


def check_layout(target: LayoutTarget, *, max_examples: int = LAYOUT_EXAMPLES, seed: int = 0) -> CheckResult:
    """Compare ``target``'s groups with distcheck's over drawn configurations (module docstring)."""
    check_type("target", target, LayoutTarget, "must be a LayoutTarget")
    tokens: set[str] = set()

    def one(cfg):
        got = target.groups(cfg)
        want = target.reference(cfg)
        for token, groups in got.items():
            tokens.add(token)
            if token not in want:
                return f"{cfg} (order {target.order(cfg)}): distcheck has no layout for {token!r}"
            mine, theirs = canonical(want[token]), canonical(groups)
            if mine != theirs:
                return (f"{cfg} (order {target.order(cfg)}): {token} groups differ, "
                        f"target {theirs} vs distcheck {mine} (first difference: {_first_difference(theirs, mine)})")
        return None

    try:
        out = falsify(one, target.configs, max_examples=max_examples, seed=seed)
    except Exception as exc:  # the target raised on a valid configuration
        first = (str(exc).splitlines() or [""])[0]
        return CheckResult(check=f"libs.{target.name}.groups", backend=target.library, verdict=FAIL,
                           detail=f"raised {type(exc).__name__}: {first}", extra={"contract": "rank-layout"})
    if out.failed:
        return CheckResult(check=f"libs.{target.name}.groups", backend=target.library, verdict=FAIL,
                           examples=out.examples, detail=out.message or "", extra={"contract": "rank-layout"})
    return CheckResult(check=f"libs.{target.name}.groups", backend=target.library, verdict=PASS,
                       examples=out.examples,
                       detail=f"{out.examples} configurations, the groups of {', '.join(sorted(tokens))} equal "
                              "distcheck's layout for the same order",
                       extra={"contract": "rank-layout", "tokens": sorted(tokens)})
