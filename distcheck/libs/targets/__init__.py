"""Adapters for the real libraries distcheck certifies, one module each.

Each adapter imports its library lazily (inside its functions), so importing this package
needs none of them. Every module has ``DIST`` (the PyPI distribution), ``TITLE`` and
``CERTIFY``: the module-level targets it defines with the contract each is certified under,
e.g. ``("ZERO2", "memory-estimator")``, so that ``distcheck certify
distcheck.libs.targets.deepspeed:ZERO2 --contract memory-estimator`` certifies one and
``distcheck libs`` certifies them all. A module may also have ``extra_rows(*, required)``:
rows that are not a certification (an estimator that cannot be imported at all: a skip naming
what to install, a FAIL when ``required``; :func:`distcheck.engine.findings.not_loaded`) and
``WORLD_CERTIFY``: :class:`WorldRun` entries, targets certified on real gloo worlds (the
``training-step``, ``context-parallel-attention`` and ``checkpoint`` contracts), each with its row name,
world sizes and example cap.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import import_module
from types import ModuleType
from typing import Any

from distcheck.core.results import CheckResult
from distcheck.engine.contracts.targets import distribution_version

__all__ = ["TARGETS", "WorldRun", "target", "installed", "dist_version", "library", "ep_placement_row"]

#: target name -> adapter module (distcheck.libs.targets.<module>)
TARGETS = {
    "deepspeed": "deepspeed",
    "accelerate": "accelerate",
    "megatron": "megatron",
    "torchtitan": "torchtitan",
    "transformers": "hf_transformers",
}


@dataclass(frozen=True)
class WorldRun:
    """A target of an adapter module certified on real worlds (``distcheck libs`` opens gloo pools of
    ``world_sizes`` ranks): ``attr`` the module-level target, ``contract`` its contract, ``name`` the rows'
    ``libs.<name>.<property>``, ``max_examples`` the cap on Hypothesis examples per property and world (every
    example is a run of every rank), ``options`` the contract's options, ``dtypes`` (None: the contract's),
    ``timeout_s`` the seconds one example may take, ``preload`` the modules the pool's parent imports before
    forking its ranks (each rank would otherwise import them itself)."""

    attr: str
    contract: str
    name: str
    world_sizes: tuple[int, ...] = (2,)
    max_examples: int = 3
    options: dict[str, Any] = field(default_factory=dict)
    dtypes: tuple[str, ...] | None = None
    timeout_s: float = 300.0
    preload: tuple[str, ...] = ()


def target(name: str) -> ModuleType:
    """The adapter module of target ``name`` (a key of :data:`TARGETS`). ConfigError for another name."""
    from distcheck.core.validate import check_choice

    check_choice("target", name, tuple(TARGETS))
    return import_module(f"distcheck.libs.targets.{TARGETS[name]}")


def dist_version(dist: str) -> str | None:
    """The installed version of distribution ``dist``, None when it is not installed."""
    return distribution_version(dist)


def installed(dist: str) -> bool:
    """Whether distribution ``dist`` is installed."""
    return dist_version(dist) is not None


def library(dist: str) -> str:
    """``"deepspeed 0.19.8"``: the distribution and its installed version, as the rows name it."""
    return f"{dist} {dist_version(dist) or 'not installed'}"


def ep_placement_row(check: str, backend: str, got: list[list[int]], *, tp: int, data: int, ep: int,
                     call: str) -> CheckResult:
    """The row naming which expert-parallel placement a library's ep groups ``got`` follow.

    ``got`` are the groups the library builds (``call``, shown in the detail) for one stage of ``tp * data``
    ranks; they are compared, as sets of sets, with each named placement of
    :func:`distcheck.parallel.layout.ep_placements` at the same degrees (chosen so that the placements differ). A pass
    names the one it matches (``extra["conventions"]``) and the other, with both groups; a FAIL when it matches
    none, or when the degrees do not tell the placements apart."""
    from distcheck.core.results import FAIL, PASS
    from distcheck.parallel.layout import ep_placements
    from distcheck.parallel.layout.contracts import canonical

    mine = {name: canonical(g) for name, g in ep_placements(tp=tp, data=data, ep=ep).items()}
    theirs = canonical(got)
    at = f"tp={tp}, {data} data-parallel ranks, ep={ep}"
    listed = "; ".join(f"{name}: {g}" for name, g in mine.items())
    matched = [name for name, g in mine.items() if g == theirs]
    if len({tuple(map(tuple, g)) for g in mine.values()}) < len(mine):
        verdict, detail = FAIL, f"at {at} the named placements coincide ({listed}): they cannot be told apart here"
    elif len(matched) == 1:
        others = "; ".join(f"not {name}, which gives {g}" for name, g in mine.items() if name != matched[0])
        verdict, detail = PASS, f"{call} gives ep groups {theirs} at {at}: {matched[0]}; {others}"
    else:
        verdict, detail = FAIL, f"{call} gives ep groups {theirs} at {at}, none of the named placements ({listed})"
    return CheckResult(check=check, backend=backend, verdict=verdict, detail=detail,
                       extra={"conventions": matched} if verdict == PASS else {})
