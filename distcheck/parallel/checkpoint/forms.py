"""Closed forms of a checkpoint's bytes, per rank and in total, under each layout.

With P parameter elements in T tensors, b bytes per parameter element and m bytes per Adam moment:

* the model state alone: P b in total; Adam's state adds two moments per element and one step count per
  tensor (a 4-byte float32 scalar in torch.optim.Adam): P (b + 2 m) + T s;
* a checkpoint holds each element once whatever the layout: DDP's replicated tensors are written once
  (torch.distributed.checkpoint's ``dedup_save_plans``), FSDP2's and tensor parallelism's shards each
  once by their owner (torch.distributed.checkpoint docs, "Distributed Checkpoint - torch.distributed.checkpoint":
  a checkpoint is one file per rank plus the ``.metadata`` file, loadable at another world size);
* a rank of a sharded layout (FSDP2 over N ranks, or tensor parallelism of degree N with every tensor
  sharded) holds 1/N of the tensors when N divides every sharded dimension: P (b + 2 m) / N;
  under DDP every rank holds all of it;
* mixed-precision Adam (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
  Parameter Models", §3.1): 16 bytes per parameter in training, 2 (fp16 weights) + 2 (fp16 gradients)
  + K = 12 (fp32 master weights, momentum, variance). A checkpoint holds no gradient: 2 + K = 14 bytes
  per parameter, and 12 when the fp16 copy is not saved (it is the master weights rounded).

For a 70B model (P = 7e10): 1.4e11 B (140 GB) of bf16 weights alone, 9.8e11 B (980 GB) with the fp32
master weights and Adam's moments (14 bytes per parameter).
"""

from __future__ import annotations

from typing import Any

from distcheck.core.closed_form import ClosedForm, Input, register

__all__ = ["FORMS"]

_P = Input("params", "parameter elements P", "params")
_T = Input("tensors", "parameter tensors T (one Adam step count each)", "count", kind="nonnegative_integer",
           default=0)
_b = Input("param_bytes", "bytes per parameter element b (4 fp32, 2 bf16)", "bytes_per_param")
_m = Input("moment_bytes", "bytes per Adam moment element m (4: fp32)", "bytes_per_param",
           kind="nonnegative_integer", default=4)
_s = Input("step_bytes", "bytes of one Adam step count (4: torch's float32 scalar)", "bytes",
           kind="nonnegative_integer", default=4)
_N = Input("world_size", "ranks the tensors are sharded over (FSDP2's dp_shard or tp)", "GPUs")
_K = Input("k", "optimizer-state bytes per parameter K (12: fp32 master, momentum, variance)", "bytes_per_param",
           kind="nonnegative_integer", default=12)
P, T, b, m, s, N, K = (i.symbol for i in (_P, _T, _b, _m, _s, _N, _K))

_DCP = "torch.distributed.checkpoint docs (Distributed Checkpoint), save and load across world sizes"
_ADAM = "Kingma and Ba 2015, Adam, Algorithm 1; torch.optim.Adam (exp_avg, exp_avg_sq, step)"
_ZERO = "Rajbhandari et al. 2020, ZeRO, section 3.1 (mixed-precision Adam: 2 + 2 + K bytes, K = 12)"


def _form(name: str, expr: Any, inputs: tuple[Input, ...], unit: str, source: str, description: str,
          constraints: tuple[str, ...] = ()) -> ClosedForm:
    return register(ClosedForm(name=name, expr=expr, inputs=inputs, unit=unit, source=source,
                               description=description, constraints=constraints))


FORMS = (
    _form("checkpoint.bytes_total.model", P * b, (_P, _b), "bytes", _DCP,
          "bytes of the model's tensors in a checkpoint, under every layout (replicated tensors written once)"),
    _form("checkpoint.bytes_total.adam", P * (b + 2 * m) + T * s, (_P, _T, _b, _m, _s), "bytes",
          f"{_DCP}; {_ADAM}", "bytes of the parameters, Adam's two moments and one step count per tensor, under "
          "every layout"),
    _form("checkpoint.bytes_per_rank.replicated", P * (b + 2 * m) + T * s, (_P, _T, _b, _m, _s), "bytes",
          f"{_DCP}; {_ADAM}", "bytes a DDP rank holds: all of the state (a checkpoint writes it once in all)"),
    _form("checkpoint.bytes_per_rank.sharded", P * (b + 2 * m) / N + T * s, (_P, _T, _b, _m, _s, _N), "bytes",
          f"{_DCP}; {_ADAM}", "bytes an FSDP2 or tensor-parallel rank holds: 1/N of the tensors and every "
          "(replicated) step count", ("world_size divides every sharded dimension", "every tensor sharded")),
    _form("checkpoint.bytes_per_param.mixed_adam", 2 + K, (_K,), "bytes_per_param", _ZERO,
          "bytes per parameter of a mixed-precision Adam checkpoint: fp16/bf16 weights and K bytes of fp32 "
          "state; training's 16 less the 2 bytes of gradient, which a checkpoint does not hold"),
    _form("checkpoint.bytes_total.mixed_adam", P * (2 + K), (_P, _K), "bytes", _ZERO,
          "bytes of a mixed-precision Adam checkpoint (step counts excluded): 14 P with K = 12"),
)
