"""Closed forms of expert parallelism (sympy only): capacity, all-to-all bytes, parameters, memory per GPU.

Inputs: tokens (T, one group's: under expert parallelism one rank's), num_experts (E), k (experts per
token), capacity_factor, capacity (C, slots per expert and group), h (hidden size), bytes_per_element
(B) and ep.

* Capacity (Lepikhin et al. 2020, "GShard", §2.2; Fedus et al. 2021, "Switch Transformers", §2.2, eq. 3):
  ``C = ceil(k T capacity_factor / E)``.
* All-to-all bytes per rank (nccl-tests doc/PERFORMANCE.md's convention: an all-to-all of a per-rank buffer
  S sends (ep-1)/ep S). A rank's dispatch buffer is (E, C, h) (GShard, §2.2: fixed-capacity buffers, empty
  slots padded), so each of the layer's four all-to-alls sends ``(ep-1)/ep E C h B``: the dispatch and the
  combine in the forward; in the backward the combine's transpose (slot gradients to the experts) and the
  dispatch's transpose (input gradients back).
* Parameters of an MoE decoder (Jiang et al. 2024, "Mixtral of Experts", §2; DeepSeek-AI 2024, "DeepSeek-V3
  Technical Report", §2.1 and §4.2): V h (2 - tied) embedding and head, h final norm, per layer the
  attention's A and 2 h norms, ``dense_layers`` layers with a dense FFN of m h f_d, the others a router
  h E and E routed plus S shared experts of m h f_e (m = 3 matrices for SwiGLU). Active parameters count
  k routed experts instead of E (and everything else).
* Memory per GPU under ep x dp x tp (Megatron-core's placement, expert tp = tp; no ZeRO): every rank holds
  1/tp of the dense parameters and 1/(ep tp) of the experts'; dp replicates both.
"""

from __future__ import annotations

from typing import Any

import sympy as sp

from distcheck.core.closed_form import ClosedForm, Input, register

__all__ = ["FORMS"]

_T = Input("tokens", "tokens of one group (one rank's under expert parallelism)", "tokens")
_E = Input("num_experts", "routed experts E", "experts")
_k = Input("k", "experts each token is routed to (top-k)", "experts")
_cf = Input("capacity_factor", "capacity factor (slots per expert over the even share k T / E)", "ratio",
            kind="positive")
_C = Input("capacity", "slots per expert and group", "tokens")
_h = Input("h", "hidden size", "elements")
_B = Input("bytes_per_element", "bytes of one element", "bytes")
_ep = Input("ep", "expert-parallel size", "GPUs")
_tp = Input("tp", "tensor-parallel size (expert tp = tp)", "GPUs")
_V = Input("vocab_size", "vocabulary size", "tokens")
_L = Input("num_layers", "decoder layers", "layers")
_Ld = Input("dense_layers", "layers with a dense FFN instead of experts", "layers", kind="nonnegative_integer")
_A = Input("attention_params", "parameters of one layer's attention", "parameters")
_m = Input("mlp_matrices", "matrices per FFN (3 for SwiGLU, 2 for a plain MLP)", "matrices")
_fe = Input("expert_ffn", "hidden size of one expert's FFN", "elements")
_fd = Input("dense_ffn", "hidden size of a dense layer's FFN", "elements", kind="nonnegative_integer")
_S = Input("shared_experts", "shared experts per MoE layer (every token uses them)", "experts",
           kind="nonnegative_integer")
_tied = Input("tied", "1 when the head shares the embedding's weights", "flag", kind="flag")
_Pd = Input("dense_params", "parameters outside the experts", "parameters", kind="nonnegative_integer")
_Pe = Input("expert_params", "parameters of the routed experts (all layers)", "parameters", kind="nonnegative_integer")
_bpp = Input("bytes_per_parameter", "bytes per parameter (16 for mixed-precision Adam: ZeRO §3)", "bytes")
T, E, k, cf, C, h, B, ep, tp = (i.symbol for i in (_T, _E, _k, _cf, _C, _h, _B, _ep, _tp))
V, L, Ld, A, m, fe, fd, S, tied, Pd, Pe, bpp = (i.symbol for i in (_V, _L, _Ld, _A, _m, _fe, _fd, _S, _tied, _Pd,
                                                                    _Pe, _bpp))

_GSHARD = "Lepikhin et al. 2020, GShard (arXiv:2006.16668) §2.2"
_SWITCH = "Fedus et al. 2021, Switch Transformers (arXiv:2101.03961) §2.2 eq. 3"
_NCCL = "nccl-tests doc/PERFORMANCE.md"
_PARAMS = ("Jiang et al. 2024, Mixtral of Experts (arXiv:2401.04088) §2; DeepSeek-AI 2024, DeepSeek-V3 Technical "
           "Report (arXiv:2412.19437) §2.1, §4.2")
_MEGATRON = "Megatron-core parallel_state (expert tensor parallel = tp); Rajbhandari et al. 2020, ZeRO §3"
_BUF = (_E, _C, _h, _B, _ep)
_buf = (ep - 1) / ep * E * C * h * B
_SHAPE = (_V, _h, _L, _Ld, _A, _m, _fe, _fd, _E, _S, _tied)


def _form(name: Any, expr: Any, inputs: Any, unit: Any, source: Any, description: Any, constraints: Any = ()) -> Any:
    return register(ClosedForm(name=name, expr=expr, inputs=inputs, unit=unit, source=source,
                               description=description, constraints=constraints))


def _params(experts: Any) -> Any:
    return (V * h * (2 - tied) + h + L * (A + 2 * h) + Ld * m * h * fd
            + (L - Ld) * (h * E + (experts + S) * m * h * fe))


FORMS = (
    _form("ep.capacity", sp.ceiling(k * T * cf / E), (_T, _E, _k, _cf), "tokens", f"{_GSHARD}; {_SWITCH}",
          "slots per expert for a group of T tokens: ceil(k T capacity_factor / E)"),
    _form("ep.dispatch.bytes_per_rank.forward", _buf, _BUF, "bytes", f"{_GSHARD}; {_NCCL}",
          "bytes a rank sends in the dispatch all-to-all: its (E, C, h) buffer less the block it keeps",
          ("ep divides num_experts",)),
    _form("ep.combine.bytes_per_rank.forward", _buf, _BUF, "bytes", f"{_GSHARD}; {_NCCL}",
          "bytes a rank sends in the combine all-to-all: the experts' outputs of the slots it received",
          ("ep divides num_experts",)),
    _form("ep.combine.bytes_per_rank.backward", _buf, _BUF, "bytes", f"{_GSHARD}; {_NCCL}",
          "bytes a rank sends in the combine's backward: its tokens' slot gradients to the experts' ranks",
          ("ep divides num_experts",)),
    _form("ep.dispatch.bytes_per_rank.backward", _buf, _BUF, "bytes", f"{_GSHARD}; {_NCCL}",
          "bytes a rank sends in the dispatch's backward: the slots' input gradients back to their tokens' ranks",
          ("ep divides num_experts",)),
    _form("ep.params.total", _params(E), _SHAPE, "parameters", _PARAMS,
          "parameters of an MoE decoder: embedding and head, norms, attention, dense FFNs, routers, all experts",
          ("dense_layers <= num_layers",)),
    _form("ep.params.active", _params(k), _SHAPE + (_k,), "parameters", _PARAMS,
          "parameters a token uses: as ep.params.total with k routed experts per MoE layer instead of E",
          ("dense_layers <= num_layers", "k <= num_experts")),
    _form("ep.memory.bytes_per_gpu", (Pd / tp + Pe / (ep * tp)) * bpp, (_Pd, _Pe, _tp, _ep, _bpp), "bytes",
          _MEGATRON, "model states per GPU under ep x dp x tp: 1/tp of the dense parameters, 1/(ep tp) of the "
          "experts'; dp replicates (no ZeRO)", ("tp divides every sharded matrix", "ep divides num_experts")),
)
