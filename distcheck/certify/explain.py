"""A failure explained by its contract: the final (shrunk) case of a failing property replayed once more through
the contract's optional hook (:meth:`~distcheck.engine.contracts.contract.Contract.explain_rank` on every rank,
then :meth:`~distcheck.engine.contracts.contract.Contract.explain` in the parent), its text joined to the
failure's detail and the certificate (the training step's first diverging tensor). A case that passes is never
replayed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from distcheck.core.errors import DistributedError
from distcheck.engine.contracts.contract import Contract
from distcheck.engine.world import RankContext, World

__all__ = ["explain_entry", "explain_failure"]


def explain_entry(ctx: RankContext, contract: Contract, target: Any, case: Any, dtype: str, options: dict) -> Any:
    """What every rank runs for the replay of a failure's final case (:meth:`Contract.explain_rank`)."""
    return contract.explain_rank(ctx, target, case, dtype, options)


def explain_failure(world: World, contract: Contract, target: Any, case: Any, dtype: str, options: dict,
                    cache: dict[str, str], describe: Callable[[DistributedError], str]) -> str:
    """The contract's explanation of a failure on its final ``case``: one more world step, the replay through
    :meth:`Contract.explain_rank`, then :meth:`Contract.explain` (once per distinct case, ``cache`` by the case's
    repr; "" for a contract that explains nothing). A replay that fails (said with ``describe``, the engine's line
    for a failed world step), or an explanation that raises, is said in the text: the failure it explains stands
    either way."""
    if not contract.explains():
        return ""
    key = repr(case)
    if key not in cache:
        try:
            results = world.run(explain_entry, contract, target, case, dtype, options)
            cache[key] = contract.explain(case, results, world.world_size, dtype, options) or ""
        except DistributedError as exc:
            cache[key] = f"the recorded replay of this case failed: {describe(exc)}"
        except Exception as exc:  # noqa: BLE001 - a defect of the explanation must not hide the failure it explains
            cache[key] = (f"the recorded replay could not be explained ({type(exc).__name__}: {exc}); a distcheck "
                          "defect, please report it")
    return cache[key]
