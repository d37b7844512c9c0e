"""Data parallelism on a real world: ``distcheck check``'s ``distributed`` stage.

torch's own ``DistributedDataParallel`` and the two weighted fixes, certified under the
data-parallel reducer contract (:mod:`distcheck.parallel.dp.contracts`) on every world of the
stage: Hypothesis draws the batches, the models and the shard sizes in the parent, every
example runs on every rank of the pool, failures are shrunk there. Rows
``<run>.grads``, ``<run>.full_batch``, ``<run>.replicated``, each with its example count:

* ``ddp.equal_shards``: DDP's plain mean is the full-batch gradient when N divides n;
* ``ddp.unequal_shards.plain``: on unequal shards it is the plain mean of shard means, off the
  full-batch gradient by exactly ``sum_k (1/(N n_k) - 1/n) G_k``;
* ``ddp.unequal_shards.hook``: DDP with :func:`~distcheck.parallel.dp.ddp.weighted_allreduce_hook`
  gives the full-batch gradient;
* ``ddp.unequal_shards.loss_scale``: so does DDP with each rank's loss scaled by ``n_k N / n``.

Unequal shards need two ranks: at world size 1 those rows are ``skip``.
"""

from __future__ import annotations

from distcheck.engine.contracts.contract import ContractRun

__all__ = ["CERTIFY", "PRELOAD", "STAGE"]

#: these checks are the ``distributed`` stage of ``distcheck check``
STAGE = "distributed"
#: imported by a pool's parent before forking (DDP's first use imports them, slowly, on every rank)
PRELOAD = ("torch._dynamo", "torch.nn.parallel")

_DDP = "torch.nn.parallel:DistributedDataParallel"
_CONTRACT = "data-parallel-reducer"

CERTIFY = (
    ContractRun("ddp.equal_shards", _CONTRACT, _DDP, {"shards": "equal"},
                doc="DDP's plain mean is the full-batch gradient on equal shards"),
    ContractRun("ddp.unequal_shards.plain", _CONTRACT, _DDP, {"shards": "unequal", "expect": "plain_mean"},
                doc="on unequal shards DDP is off by exactly sum_k (1/(N n_k) - 1/n) G_k"),
    ContractRun("ddp.unequal_shards.hook", _CONTRACT, "distcheck.parallel.dp.ddp:weighted_allreduce_hook",
                {"shards": "unequal"}, doc="the weighted comm hook gives the full-batch gradient"),
    ContractRun("ddp.unequal_shards.loss_scale", _CONTRACT, _DDP, {"shards": "unequal", "loss_scale": True},
                doc="scaling each rank's loss by n_k N / n gives the full-batch gradient"),
)
