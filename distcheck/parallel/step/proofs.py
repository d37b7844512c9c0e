"""Proofs (sympy) of the training step's closed forms against those of other packages: its data-parallel
bytes are ZeRO-3's plus HSDP's all-reduce of the shard, its tensor-parallel bytes are sequence
parallelism's per-block bytes times the blocks, and the token weight is the mean of means' exactly when
every micro-batch holds the same number of tokens."""

from __future__ import annotations

from distcheck.core.vocab import Collective
from distcheck.engine.catalogue import get
from distcheck.engine.proofs import proof, zero

__all__ = ["dp_bytes", "tp_bytes", "token_weight_on_equal_microbatches"]


@proof("proof.step.dp_bytes")
def dp_bytes() -> tuple[bool, str]:
    """step.comm_bytes_per_rank.dp == m (zero.comm_bytes_per_rank.stage3 over n = dp_shard
    + comm.bytes_per_rank.all_reduce of the P b / dp_shard shard over n = dp_replicate): FSDP2 is ZeRO-3 per
    micro-batch, and HSDP adds one all-reduce of each rank's gradient shard (Rajbhandari et al. 2020, §7)."""
    step, z3 = get("step.comm_bytes_per_rank.dp"), get("zero.comm_bytes_per_rank.stage3")
    ar = get(f"comm.bytes_per_rank.{Collective.ALL_REDUCE}")
    s = step.symbols
    zero3 = z3.expr.subs({z3.symbols["params"]: s["params"], z3.symbols["n"]: s["dp_shard"],
                          z3.symbols["bytes_per_element"]: s["bytes_per_element"]})
    shard = ar.expr.subs({ar.symbols["n"]: s["dp_replicate"],
                          ar.symbols["size_bytes"]: s["params"] * s["bytes_per_element"] / s["dp_shard"]})
    on = s["m"] * (zero3 + shard)
    return zero(step.expr - on), f"{step.expr} = m ({zero3} + {shard})"


@proof("proof.step.tp_bytes")
def tp_bytes() -> tuple[bool, str]:
    """step.comm_bytes_per_rank.tp == 4 m L sp.block.bytes_per_rank (n = tp): per micro-batch, L layers of two
    sequence-parallel blocks (attention, MLP), each sending a block's bytes in the forward and again in the
    backward (Korthikanti et al. 2022, §4.2.2, Figure 5)."""
    step, block = get("step.comm_bytes_per_rank.tp"), get("sp.block.bytes_per_rank")
    s = step.symbols
    per_block = block.expr.subs({block.symbols["t"]: s["tp"], block.symbols["size_bytes"]: s["size_bytes"]})
    on = s["m"] * s["layers"] * 2 * 2 * per_block
    return zero(step.expr - on), f"{step.expr} = m layers x 2 blocks x 2 passes x {per_block}"


@proof("proof.step.token_weight_equal_microbatches")
def token_weight_on_equal_microbatches() -> tuple[bool, str]:
    """step.loss.mean_of_means_weight at n_k = T / (dp m) == step.loss.token_weight: the mean of per-micro-batch
    means is the token mean exactly when every micro-batch of every dp rank holds T / (dp m) tokens (Hugging
    Face, "Fixing Gradient Accumulation", 2024); and it is not the token mean at n_k = 2 T / (dp m)."""
    tw, mm = get("step.loss.token_weight"), get("step.loss.mean_of_means_weight")
    tokens, m = tw.symbols["tokens"], mm.symbols
    equal = mm.expr.subs(m["n_k"], tokens / (m["dp"] * m["m"]))
    doubled = mm.expr.subs(m["n_k"], 2 * tokens / (m["dp"] * m["m"]))
    holds = zero(equal - tw.expr) and not zero(doubled - tw.expr)
    return holds, f"1/(dp m T/(dp m)) = {equal} = {tw.expr}; at twice the tokens {doubled} != {tw.expr}"
