"""Mutants of expert parallelism: the mistakes an MoE layer makes.

===================================  ==========================================  =======================
mutant                               mistake                                     killed by
===================================  ==========================================  =======================
ep.combine.weights_twice             the gate applied in the combine and again   ep.layer.forward
                                     (``g^2 y``)
ep.residual.dropped_not_passed       a token whose choices are all dropped       ep.layer.forward
                                     returns 0 instead of itself
ep.router.softmax_over_all           ``topk_then_softmax`` gates taken from the  ep.layer.forward
                                     softmax over all experts
ep.combine.experts_permuted          the combine reading expert e + 1's outputs  ep.layer.forward
                                     for expert e's slots
ep.backward.experts_permuted         the input gradients of expert e's slots     ep.layer.backward
                                     returned as expert e + 1's
ep.capacity.global_batch             capacity from the global batch (ep T_r      ep.tokens.conserved
                                     tokens) on every rank: fewer drops
ep.aux_loss.local_batch              the aux loss of rank 0's tokens, never      ep.aux_loss
                                     all-reduced over the ep group
===================================  ==========================================  =======================
"""

from __future__ import annotations

from typing import Any

import numpy as np

from distcheck.core.vocab import Router
from distcheck.engine.mutants import mutant
from distcheck.parallel.ep import reference as ref

__all__ = ["ep_combine_weights_twice", "ep_residual_dropped_not_passed", "ep_router_softmax_over_all",
           "ep_combine_experts_permuted", "ep_backward_experts_permuted", "ep_capacity_global_batch",
           "ep_aux_loss_local_batch"]


def _split(y: Any, ep: Any) -> Any:
    n = y.shape[0] // ep
    return [y[i * n:(i + 1) * n] for i in range(ep)]


def _forward_with(x_shards: Any, wg: Any, w1_shards: Any, w2_shards: Any, k: Any, capacity_factor: Any, router: Any,
                  log: Any, combine: Any) -> Any:
    ep, x, wg, _, _, r, _, back = ref._ep_forward(x_shards, wg, w1_shards, w2_shards, k, capacity_factor, router,
                                                  log)
    y = combine(x, r, back)
    _, aux = ref.ep_moe_layer(x_shards, wg, w1_shards, w2_shards, k=k, capacity_factor=capacity_factor, router=router)
    return _split(y, ep), aux


@mutant("ep.combine.weights_twice", "ep.layer.forward")
def ep_combine_weights_twice(x_shards: Any, wg: Any, w1_shards: Any, w2_shards: Any, *, k: Any = 2,
                             capacity_factor: Any = 1.0,
                             router: Any = Router.TOPK_THEN_SOFTMAX, log: Any = None) -> Any:
    """The combine weighting the expert outputs by their gates twice."""
    def combine(x: Any, r: Any, back: Any) -> Any:
        twice = ref.Routing(r.experts, r.gates * r.gates, r.probs, r.slots, r.capacity, r.groups)
        return ref._combine(x, twice, back)

    return _forward_with(x_shards, wg, w1_shards, w2_shards, k, capacity_factor, router, log, combine)


@mutant("ep.residual.dropped_not_passed", "ep.layer.forward")
def ep_residual_dropped_not_passed(x_shards: Any, wg: Any, w1_shards: Any, w2_shards: Any, *, k: Any = 2,
                                   capacity_factor: Any = 1.0,
                                   router: Any = Router.TOPK_THEN_SOFTMAX, log: Any = None) -> Any:
    """Fully dropped tokens come out as zeros (the residual added only to processed tokens)."""
    def combine(x: Any, r: Any, back: Any) -> Any:
        y = ref._combine(x, r, back)
        y[~r.kept.any(axis=1)] = 0.0
        return y

    return _forward_with(x_shards, wg, w1_shards, w2_shards, k, capacity_factor, router, log, combine)


@mutant("ep.router.softmax_over_all", "ep.layer.forward")
def ep_router_softmax_over_all(x_shards: Any, wg: Any, w1_shards: Any, w2_shards: Any, *, k: Any = 2,
                               capacity_factor: Any = 1.0,
                               router: Any = Router.TOPK_THEN_SOFTMAX, log: Any = None) -> Any:
    """Every convention served with the full softmax's probabilities (right only for softmax_then_topk)."""
    outs, _ = ref.ep_moe_layer(x_shards, wg, w1_shards, w2_shards, k=k, capacity_factor=capacity_factor,
                               router=Router.SOFTMAX_THEN_TOPK, log=log)
    _, aux = ref.ep_moe_layer(x_shards, wg, w1_shards, w2_shards, k=k, capacity_factor=capacity_factor, router=router)
    return outs, aux


@mutant("ep.combine.experts_permuted", "ep.layer.forward")
def ep_combine_experts_permuted(x_shards: Any, wg: Any, w1_shards: Any, w2_shards: Any, *, k: Any = 2,
                                capacity_factor: Any = 1.0,
                                router: Any = Router.TOPK_THEN_SOFTMAX, log: Any = None) -> Any:
    """The combine all-to-all's blocks put back one expert off: expert e's slots read expert e + 1's outputs."""
    def combine(x: Any, r: Any, back: Any) -> Any:
        return ref._combine(x, r, np.roll(back, -1, axis=1))

    return _forward_with(x_shards, wg, w1_shards, w2_shards, k, capacity_factor, router, log, combine)


@mutant("ep.backward.experts_permuted", "ep.layer.backward")
def ep_backward_experts_permuted(x_shards: Any, wg: Any, w1_shards: Any, w2_shards: Any, dout_shards: Any, *,
                                 k: Any = 2, capacity_factor: Any = 1.0,
                                 router: Any = Router.TOPK_THEN_SOFTMAX, log: Any = None) -> Any:
    """The backward's second all-to-all returning expert e's input gradients into expert e + 1's slots."""
    dx, dwg, dw1, dw2 = ref.ep_moe_layer_backward(x_shards, wg, w1_shards, w2_shards, dout_shards, k=k,
                                                  capacity_factor=capacity_factor, router=router, log=log)
    ep, x, wg_, _, _, r, send, back = ref._ep_forward(x_shards, wg, w1_shards, w2_shards, k, capacity_factor, router,
                                                      None)
    dout = np.concatenate(dout_shards)
    E, h = wg_.shape[1], x.shape[1]
    dg, dy = ref._gate_grads(dout, r, back, E)
    w1, w2 = np.concatenate(w1_shards), np.concatenate(w2_shards)
    dxs = np.zeros_like(send)
    for e in range(E):
        got, _, _ = ref._expert_backward(send[:, e].reshape(-1, h), w1[e], w2[e], dy[:, e].reshape(-1, h))
        dxs[:, (e + 1) % E] = got.reshape(ep, r.capacity, h)
    dz = ref._router_dz(x, wg_, r, dg, router)
    return _split(ref._token_dx(dout, r, dxs) + ref.rowdot(dz, wg_.T), ep), dwg, dw1, dw2


@mutant("ep.capacity.global_batch", "ep.tokens.conserved")
def ep_capacity_global_batch(x_shards: Any, wg: Any, w1_shards: Any, w2_shards: Any, *, k: Any = 2,
                             capacity_factor: Any = 1.0,
                             router: Any = Router.TOPK_THEN_SOFTMAX, log: Any = None) -> Any:
    """Each rank's capacity computed from the global batch's token count (ep times its own)."""
    ep = len(x_shards)
    return ref.ep_moe_layer(x_shards, wg, w1_shards, w2_shards, k=k, capacity_factor=capacity_factor * ep,
                            router=router, log=log)


@mutant("ep.aux_loss.local_batch", "ep.aux_loss")
def ep_aux_loss_local_batch(x_shards: Any, wg: Any, w1_shards: Any, w2_shards: Any, *, k: Any = 2,
                            capacity_factor: Any = 1.0,
                            router: Any = Router.TOPK_THEN_SOFTMAX, log: Any = None) -> Any:
    """The aux loss of rank 0's tokens only (the counts and probabilities never all-reduced)."""
    outs, _ = ref.ep_moe_layer(x_shards, wg, w1_shards, w2_shards, k=k, capacity_factor=capacity_factor,
                               router=router, log=log)
    experts, _, probs = ref.route(ref.rowdot(np.asarray(x_shards[0], dtype=np.float64), wg), k, router)
    return outs, ref.aux_loss(probs, experts, np.asarray(wg).shape[1])
