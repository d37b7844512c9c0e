"""Closed forms for training-state memory per GPU (no activations).

Bytes per parameter by convention, the state ``b P / (t p)`` split by tensor
and pipeline parallelism (the lesson "Scaling and distributed training", section 3), its components, the
fewest GPUs that hold a total, the smallest power-of-two tp that fits and the
smallest tp*pp product that fits. All byte quantities are in bytes (convert
with :func:`distcheck.core.units.bytes_to`: GB = 1e9, GiB = 2**30).
"""

from __future__ import annotations

import sympy as sp

from distcheck.core.closed_form import ClosedForm, Input, register

__all__ = ["BYTES_PER_PARAM", "TRAIN_STATE_BYTES", "WEIGHTS_BYTES", "GRADS_BYTES", "OPTIMIZER_BYTES",
           "MIN_GPUS", "MIN_TP_POW2", "MIN_TP_PP_PRODUCT"]

# name -> (weights, grads, fp32 master, first moment, second moment, source)
_CONVENTIONS = {
    "mixed_adamw": (2, 2, 4, 4, 4, "lesson 'Scaling and distributed training' section 1; "
                                   "ZeRO paper (Rajbhandari et al. 2020) section 3.1, K = 12"),
    "mixed_adamw_fp32_grads": (2, 4, 4, 4, 4, "Megatron-LM theoretical memory usage (fp32 gradients)"),
    "adam_8bit": (2, 2, 4, 1, 1, "bitsandbytes 8-bit Adam (per-block scales ignored); lesson section 4 exercise"),
    "sgd_momentum": (2, 2, 4, 4, 0, "mixed-precision SGD with momentum: fp32 master + fp32 momentum"),
    "moments_only": (2, 2, 0, 4, 4, "chapter 'Chapter 26: Distributed Training' table: no fp32 master; "
                                    "the lesson's 'common mistake'"),
}

BYTES_PER_PARAM: dict[str, ClosedForm] = {}
for _name, (_w, _g, _m, _m1, _m2, _src) in _CONVENTIONS.items():
    BYTES_PER_PARAM[_name] = register(ClosedForm(
        # builds:
        #   memory.bytes_per_param.adam_8bit, memory.bytes_per_param.mixed_adamw,
        #   memory.bytes_per_param.mixed_adamw_fp32_grads, memory.bytes_per_param.moments_only,
        #   memory.bytes_per_param.sgd_momentum
        name=f"memory.bytes_per_param.{_name}",
        expr=sp.Integer(_w) + sp.Integer(_g) + sp.Integer(_m) + sp.Integer(_m1) + sp.Integer(_m2),
        inputs=(),
        unit="bytes_per_param",
        source=_src,
        description=(f"weights {_w} + grads {_g} + fp32 master {_m} + first moment {_m1} + second moment {_m2} "
                     "bytes per parameter"),
    ))

P_in = Input("params", "parameter count P", "params")
b_in = Input("bytes_per_param", "bytes of state per parameter", "bytes_per_param", kind="positive", default=16)
t_in = Input("tp", "tensor-parallel size", "count", default=1)
p_in = Input("pp", "pipeline-parallel size (stages)", "count", default=1)
P, b, t, p = (i.symbol for i in (P_in, b_in, t_in, p_in))

_SRC = "lesson 'Scaling and distributed training' section 3, Memory per GPU: b P / (t p)"

TRAIN_STATE_BYTES = register(ClosedForm(
    name="memory.train_state_bytes",
    expr=b * P / (t * p),
    inputs=(P_in, b_in, t_in, p_in),
    unit="bytes",
    source=_SRC,
    description="weights + grads + optimizer state per GPU, split t p ways by TP and PP; DP does not reduce it",
))

_component_inputs = {
    "weights": Input("weight_bytes", "bytes per parameter of the working weights", "bytes_per_param",
                     kind="positive", default=2),
    "grads": Input("grad_bytes", "bytes per parameter of the gradients", "bytes_per_param",
                   kind="positive", default=2),
    "optimizer": Input("optimizer_bytes_per_param", "fp32 master + moments, the ZeRO paper's K",
                       "bytes_per_param", kind="nonnegative", default=12),
}


def _component(what: str) -> ClosedForm:
    c = _component_inputs[what]
    return register(ClosedForm(
        # builds memory.grads_bytes, memory.optimizer_bytes, memory.weights_bytes
        name=f"memory.{what}_bytes",
        expr=c.symbol * P / (t * p),
        inputs=(P_in, c, t_in, p_in),
        unit="bytes",
        source=_SRC + "; components per the ZeRO paper section 3.1 (2 + 2 + K)",
        description=f"{what} bytes per GPU under TP x PP (default: mixed-precision AdamW)",
    ))


WEIGHTS_BYTES = _component("weights")
GRADS_BYTES = _component("grads")
OPTIMIZER_BYTES = _component("optimizer")

_total_in = Input("total_bytes", "bytes to hold", "bytes", kind="positive")
_gpu_in = Input("gpu_bytes", "memory of one GPU", "bytes", kind="positive")

MIN_GPUS = register(ClosedForm(
    name="memory.min_gpus",
    expr=sp.ceiling(_total_in.symbol / _gpu_in.symbol),
    inputs=(_total_in, _gpu_in),
    unit="GPUs",
    source="chapter 'Chapter 26: Distributed Training': 'H100 80GB GPUs needed: minimum 11' "
           "(870 GB / 80 GB, rounded up)",
    description="fewest GPUs that hold the total if it split perfectly: ceil(total / gpu)",
))

_budget_in = Input("budget_bytes", "memory budget per GPU", "bytes", kind="positive")


class ceil_log2(sp.Function):
    """``ceil(log2(n))`` for a positive integer n, exact: ``(n - 1).bit_length()``. sympy's own
    ``ceiling(log(n, 2))`` rounds through a float and gives 31 for n = 2^31 + 1 (sympy 1.14)."""

    @classmethod
    def eval(cls, n: sp.Expr) -> sp.Integer | None:
        if n.is_Integer and n >= 1:
            return sp.Integer(int(n - 1).bit_length())
        return None


MIN_TP_POW2 = register(ClosedForm(
    name="memory.min_tp_pow2",
    expr=2 ** ceil_log2(sp.ceiling(b * P / _budget_in.symbol)),
    inputs=(P_in, b_in, _budget_in),
    unit="count",
    source="lesson 'Scaling and distributed training' section 6 exercise: smallest power-of-two TP that fits "
           "(13B at 80 GB -> 4)",
    description="smallest power of two t with b P / t <= budget: 2^ceil(log2(ceil(b P / budget))); no upper cap",
))

MIN_TP_PP_PRODUCT = register(ClosedForm(
    name="memory.min_tp_pp_product",
    expr=sp.ceiling(b * P / _budget_in.symbol),
    inputs=(P_in, b_in, _budget_in),
    unit="GPUs",
    source="lesson 'Scaling and distributed training' section 2 exercise 3: smallest TP x PP split that fits "
           "(b P / (t p) <= budget)",
    description="smallest t*p with b P / (t p) <= budget when any pp is allowed: ceil(b P / budget) "
                "(t = 1 or any power of two dividing it); requiring pp | num_layers can make it larger",
    constraints=("ceil(b P / budget) <= max_pp (otherwise t > 1 is forced and t*ceil(q/t) may exceed q)",
                 "no divisibility constraint on pp (num_layers=None)"),
))
