"""lodestone-rock/RamTorch#13: "ZeRO-2 is broken due to a hook registration bug" (with a reproduction of the
ZeRO-1 ``broadcast_zero_params`` bug in the same report).

ZeRO-1 shards the optimizer state: each rank steps the parameters it owns, then sends them back to the others.
RamTorch's ``broadcast_zero_params()`` skipped every parameter flagged ``is_ramtorch`` (after
``replace_linear_with_ramtorch()``, nearly all of them), so after ``optimizer.step()`` only the owner held the
updated shard and every other rank kept its stale copy: the ranks became different models, silently.
Re-created in plain torch: torch's ``ZeroRedundancyOptimizer`` whose step never sends the updated parameters
back (its ``_sync_params`` a no-op, examples/zero_mutants.py); the twin is torch's ``ZeroRedundancyOptimizer``."""

from __future__ import annotations

from distcheck.zoo import Entry
from examples.zero_mutants import ZeroWithoutAllGather

ENTRY = Entry(
    reference="lodestone-rock/RamTorch#13",
    url="https://github.com/lodestone-rock/RamTorch/issues/13",
    library="RamTorch (ZeRO-1 / ZeRO-2 over torch.distributed)", versions="main as reported (March 2026)",
    bug_class="ZeRO optimizer-state sharding: updated shards not sent back",
    contract="sharded-optimizer-step", property="params",
    bug=ZeroWithoutAllGather, fixed="torch.distributed.optim:ZeroRedundancyOptimizer",
    summary="each rank steps only the parameters it owns and never receives the others': stale replicas diverge",
    reproduction="plain torch re-creation",
)
