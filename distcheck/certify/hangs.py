"""A hang fails the target once: the verdicts of a certification whose world step timed out.

A world step that outlives its timeout is neither replayed nor shrunk by the engine
(:mod:`distcheck.certify.engine`), since each try would wait out the timeout again. The property
being certified FAILs with every stuck rank's Python stack (:attr:`distcheck.errors.WorldTimeout.stacks`,
faulthandler's dump); every property left, at that dtype and at every dtype and world size still to
run, is a skip with :data:`HUNG_REASON`, and the worlds still to run are never started.
"""

from __future__ import annotations

from distcheck.certify.certificate import PropertyVerdict
from distcheck.engine.contracts.contract import Contract
from distcheck.report import FAIL, SKIP

__all__ = ["HUNG_REASON", "Hung", "hung_verdicts", "skipped_after_hang"]

#: the reason of every property skipped after a step of the same target timed out
HUNG_REASON = "a previous property hung"


class Hung(BaseException):  # not an error: it stops Hypothesis, which catches Exception
    """Raised at the first world step that timed out, so that Hypothesis neither replays nor shrinks it."""


def _reason(contract: Contract, hung_property: str, dtype: str, world_size: int) -> str:
    return f"{HUNG_REASON} ({contract.name}.{hung_property}[{dtype}] at world size {world_size})"


def hung_verdicts(contract: Contract, dtype: str, options: dict, ws: int, backend: str, *, name: str,
                  remaining: list[str], case: object, message: str, ranks: list[int], stacks: dict[int, str],
                  calls: int, replay: str, seconds: float) -> dict[str, PropertyVerdict]:
    """Property ``name`` FAILs with the stuck ranks' ``stacks`` (``case``: the case that hung, not shrunk;
    ``calls``: examples run); every other property of ``remaining`` is a skip (:data:`HUNG_REASON`)."""
    specs = {p.name: p for p in contract.properties}
    out = {name: PropertyVerdict(
        name, contract.statement(name, dtype, options), specs[name].regime, dtype, ws, backend, FAIL,
        examples=calls, counterexample=repr(case), failure=message, ranks=list(ranks), reproduce=replay,
        examples_until_failure=calls, seconds=seconds, hung=True, stacks=dict(sorted(stacks.items())))}
    for p in remaining:
        if p != name:
            out[p] = PropertyVerdict(p, contract.statement(p, dtype, options), specs[p].regime, dtype, ws, backend,
                                     SKIP, failure=_reason(contract, name, dtype, ws))
    return out


def skipped_after_hang(contract: Contract, dtype: str, options: dict, ws: int, backend: str,
                       hung: PropertyVerdict) -> list[PropertyVerdict]:
    """Every property at ``dtype`` and world size ``ws``, skipped because ``hung`` timed out before."""
    reason = _reason(contract, hung.property, hung.dtype, hung.world_size)
    return [PropertyVerdict(p.name, contract.statement(p.name, dtype, options), p.regime, dtype, ws, backend, SKIP,
                            failure=reason) for p in contract.properties]
