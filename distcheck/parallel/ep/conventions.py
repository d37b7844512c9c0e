"""The ``moe-layer`` contract's named conventions, and which of them a failing layer follows.

A failure of ``forward`` or ``grads`` is tried against the other values of ``residual``, ``renormalise`` and
``router_grad`` (the options the output and gradients depend on), one change then pairs, and a failure of
``aux_loss`` against those of ``aux_scope``, ``aux_counts`` and ``aux_scale``; a change is named when the
ranks' values pass the same bounded check under it (:mod:`distcheck.engine.contracts.conventions`). So the
GShard-style top-2 router that renormalises its kept gates, failing ``forward`` under the defaults, is told
``matches convention renormalise=true (...): certify with --option renormalise=true``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from distcheck.engine.contracts.conventions import hint as word
from distcheck.engine.contracts.conventions import search

__all__ = ["LABELS", "LAYER_OPTIONS", "AUX_OPTIONS", "hint"]

#: each convention value, what it is and where it comes from
LABELS: dict[tuple[str, Any], str] = {
    ("residual", True): "the layer returns x plus the experts' combine",
    ("residual", False): "the combine alone, as fairscale's and DeepSpeed's MOELayer return",
    ("renormalise", True): "GShard top-2, Mixtral: the kept gates divided by their sum, fairscale's and "
                           "DeepSpeed's top2gating",
    ("renormalise", False): "the gates fixed before dropping, Switch Transformers",
    ("router_grad", "summed"): "the router's gradient summed over the ranks",
    ("router_grad", "local"): "this rank's share of the router's gradient, left to data parallelism as fairscale "
                              "and DeepSpeed leave it",
    ("aux_scope", "global"): "the aux loss over the whole batch",
    ("aux_scope", "per_rank"): "GShard's per-group l_aux, each rank's tokens",
    ("aux_counts", "all_choices"): "f_e over all T k choices, Switch Transformers eq. 5",
    ("aux_counts", "first_choice"): "f_e over the first choices, GShard Algorithm 1's mask1",
    ("aux_scale", "E"): "E sum_e f_e P_e, Switch Transformers eq. 4",
    ("aux_scale", "1/E"): "mean_e f_e P_e, GShard's torch.mean(me * ce)",
}
#: the options the output and the gradients depend on, with their values
LAYER_OPTIONS: dict[str, tuple[Any, ...]] = {"renormalise": (False, True), "residual": (True, False),
                                             "router_grad": ("summed", "local")}
#: the options the aux loss depends on, with their values
AUX_OPTIONS: dict[str, tuple[Any, ...]] = {"aux_scale": ("E", "1/E"), "aux_counts": ("all_choices", "first_choice"),
                                           "aux_scope": ("global", "per_rank")}


def hint(failing: Sequence[str], options: dict, outcomes: Callable[[dict], dict[str, Any]]) -> dict[str, str]:
    """For each of ``failing`` (forward, grads, aux_loss) whose values another convention gives, the hint to
    append to its failure (none for the others). ``outcomes(options)``: the properties' outcomes on the failing
    example under ``options`` (:func:`distcheck.parallel.ep.contracts.numeric`)."""
    out: dict[str, str] = {}
    layer = [p for p in failing if p in ("forward", "grads")]
    if layer:
        def passes(alt: dict) -> bool:
            got = outcomes(alt)
            return got["forward"].ok and got["grads"].ok

        text = word(search(options, LAYER_OPTIONS, passes, LABELS))
        out.update({p: text for p in layer if text})
    if "aux_loss" in failing:
        text = word(search(options, AUX_OPTIONS, lambda alt: outcomes(alt)["aux_loss"].ok,
                           LABELS))
        if text:
            out["aux_loss"] = text
    return out
