"""Expert parallelism on a real world: its rows of ``distcheck check``'s layers stage.

Under the ``moe-layer`` contract (:mod:`distcheck.parallel.ep.contracts`), on every world of the stage from two
ranks (ep = world size), in float64 and float32: Hypothesis draws the tokens, the router, the experts, the output
gradient, top-k, the capacity factor and the router convention in the parent; every example runs a forward and
a backward on every rank of the pool against the single-device MoE in float64. Rows ``ep.all_to_all.<property>``
(forward, grads, tokens, aux_loss, all_to_all.forward, all_to_all.backward), each with its example count:

* ``ep.all_to_all``: GShard's layer with padded (E, C, h) buffers in plain torch.distributed
  (``all_to_all_single`` dispatch and combine; :data:`distcheck.parallel.ep.plans.ALL_TO_ALL_MOE`).

At most ten examples per property and dtype (each is a forward and backward of every rank). The MoE of
``examples/my_moe.py`` is certified by ``distcheck certify`` (``tests/test_ep_contract.py``); its twin with
capacity over the global batch fails there.
"""

from __future__ import annotations

from distcheck.engine.contracts.contract import ContractRun

__all__ = ["CERTIFY", "STAGE"]

#: these checks join the layers stage of ``distcheck check``
STAGE = "layers"

CERTIFY = (
    ContractRun("ep.all_to_all", "moe-layer", "distcheck.parallel.ep.plans:ALL_TO_ALL_MOE", max_examples=10,
                doc="GShard's MoE layer in plain torch.distributed: top-k routing, per-rank capacity, "
                    "all_to_all_single dispatch and combine of padded (E, C, h) buffers, the residual, the "
                    "global aux loss"),
)
