"""Closed forms of the ZeRO paper: model-state bytes per GPU and communication per rank.

Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models" (SC'20, arXiv:1910.02054). With Psi parameters, N_d
data-parallel ranks and K bytes of optimizer state per parameter (12 for
mixed-precision Adam: fp32 master, m, v), Figure 1 gives

* stage 0 (baseline DDP): (2 + 2 + K) Psi
* stage 1 (P_os):          2 Psi + 2 Psi + K Psi / N_d
* stage 2 (P_os+g):        2 Psi + (2 + K) Psi / N_d
* stage 3 (P_os+g+p):      (2 + 2 + K) Psi / N_d

Section 7 counts communication per rank per step: DDP and stages 1-2 move
2 Psi elements (reduce-scatter + all-gather), stage 3 moves 3 Psi (two
parameter all-gathers and one gradient reduce-scatter), 1.5x DDP. The paper
counts Psi per collective, dropping the ring factor (N_d - 1) / N_d.
``zero.comm_bytes_per_rank.*`` keeps it and counts bytes: each collective of
Psi elements of b bytes (2 for bf16) sends (n - 1)/n Psi b bytes per rank on a
ring (nccl-tests ``doc/PERFORMANCE.md``), so DDP and stages 1-2 send
2 (n-1)/n Psi b and stage 3 sends 3 (n-1)/n Psi b.
"""

from __future__ import annotations

from distcheck.core.closed_form import ClosedForm, Input, register

__all__ = ["BYTES_PER_GPU", "COMM_ELEMENTS_PER_RANK", "COMM_BYTES_PER_RANK"]

P_in = Input("params", "parameter count Psi", "params")
N_in = Input("dp", "data-parallel ranks N_d", "count")
K_in = Input("k", "optimizer-state bytes per parameter K (fp32 master + moments)", "bytes_per_param",
             kind="nonnegative", default=12)
P, N, K = P_in.symbol, N_in.symbol, K_in.symbol

_FIG1 = "ZeRO paper (Rajbhandari et al. 2020) Figure 1 and section 5 (ZeRO-DP)"

_stages = {
    0: ((2 + 2 + K) * P, "baseline DDP: (2 + 2 + K) Psi, everything replicated"),
    1: (2 * P + 2 * P + K * P / N, "P_os: optimizer state sharded, 4 Psi + K Psi / N_d"),
    2: (2 * P + (2 + K) * P / N, "P_os+g: optimizer state and gradients sharded, 2 Psi + (2 + K) Psi / N_d"),
    3: ((2 + 2 + K) * P / N, "P_os+g+p: everything sharded, (2 + 2 + K) Psi / N_d"),
}

BYTES_PER_GPU: dict[int, ClosedForm] = {
    s: register(ClosedForm(
        # builds zero.bytes_per_gpu.stage0, zero.bytes_per_gpu.stage1, zero.bytes_per_gpu.stage2,
        #   zero.bytes_per_gpu.stage3
        name=f"zero.bytes_per_gpu.stage{s}",
        expr=expr,
        inputs=(P_in, N_in, K_in),
        unit="bytes",
        source=_FIG1,
        description=f"model-state bytes per GPU (bf16 weights and grads), {desc}",
    ))
    for s, (expr, desc) in _stages.items()
}

_comm = {
    "ddp": (2 * P, "DDP: one all-reduce of the gradients = reduce-scatter + all-gather, 2 Psi"),
    "stage1": (2 * P, "P_os: reduce-scatter gradients, all-gather parameters, 2 Psi (same as DDP)"),
    "stage2": (2 * P, "P_os+g: reduce-scatter gradients, all-gather parameters, 2 Psi (same as DDP)"),
    "stage3": (3 * P, "P_os+g+p: all-gather parameters in forward and backward, reduce-scatter gradients, 3 Psi"),
}

COMM_ELEMENTS_PER_RANK: dict[str, ClosedForm] = {
    k: register(ClosedForm(
        # builds:
        #   zero.comm_elements_per_rank.ddp, zero.comm_elements_per_rank.stage1, zero.comm_elements_per_rank.stage2,
        #   zero.comm_elements_per_rank.stage3
        name=f"zero.comm_elements_per_rank.{k}",
        expr=expr,
        inputs=(P_in,),
        unit="elements",
        source="ZeRO paper (Rajbhandari et al. 2020) section 7 (communication analysis of ZeRO-DP)",
        description=f"elements each rank sends per step, Psi per collective (ring factor dropped); {desc}",
    ))
    for k, (expr, desc) in _comm.items()
}

_n_in = Input("n", "data-parallel ranks N_d", "GPUs")
_b_in = Input("bytes_per_element", "bytes of one communicated element (2 for bf16)", "bytes", default=2)
_COLLECTIVES = {"ddp": 2, "stage1": 2, "stage2": 2, "stage3": 3}

COMM_BYTES_PER_RANK: dict[str, ClosedForm] = {
    k: register(ClosedForm(
        # builds:
        #   zero.comm_bytes_per_rank.ddp, zero.comm_bytes_per_rank.stage1, zero.comm_bytes_per_rank.stage2,
        #   zero.comm_bytes_per_rank.stage3
        name=f"zero.comm_bytes_per_rank.{k}",
        expr=c * (_n_in.symbol - 1) / _n_in.symbol * P * _b_in.symbol,
        inputs=(P_in, _n_in, _b_in),
        unit="bytes",
        source="ZeRO paper (Rajbhandari et al. 2020) section 7 with the ring factor (n-1)/n of nccl-tests "
               "doc/PERFORMANCE.md",
        description=f"bytes each rank sends per step: {c} collectives of Psi elements (reduce-scatter and "
                    f"all-gather{'s' if c == 3 else ''}), each (n-1)/n Psi b bytes on a ring",
    ))
    for k, c in _COLLECTIVES.items()
}
