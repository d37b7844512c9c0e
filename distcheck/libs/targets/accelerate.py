"""accelerate's training-memory estimate (memory-estimator contract).

Target: ``accelerate estimate-memory``'s "Training using Adam" column. The command loads
a model on the meta device, sums its fp32 bytes (4 P) and calls
``accelerate.commands.estimate.estimate_training_usage(bytes, dtype)``, which returns the
components ``model``, ``gradients``, ``optimizer`` and ``step``; the column prints their
maximum with ``accelerate.utils.convert_bytes``. The adapter makes the same calls for
P parameters (no model download) at the dtypes with a training figure, float32 and float16.
It does not depend on N (no data parallelism: stage 0).

``BAD_INPUT`` (bad-input contract) probes ``estimate_training_usage`` with dtype strings it
does not know. Its setup is the positive control: a valid dtype (float16) must be accepted
first, with every part positive, or the setup raises and the row FAILs (so that a changed
signature, refusing every call, cannot read as "refuses bad input").

    distcheck certify distcheck.libs.targets.accelerate:FLOAT16 --contract memory-estimator
    distcheck certify distcheck.libs.targets.accelerate:BAD_INPUT --contract bad-input

Gradient accumulation under DDP (training-step contract, on gloo worlds). Both targets run accelerate's own
loop on distcheck's tiny Llama: every rank builds ``Accelerator()`` (``cpu=True`` on CPU ranks; the rank pool's
world is already initialized, so accelerate reads its rank and size from the environment variables torchrun
would set, which the adapter sets for the constructor only), ``accelerator.prepare(model)`` (accelerate's
``DistributedDataParallel`` wrapper over the whole world: dp_replicate = world size), then per micro-batch
``with accelerator.accumulate(model):`` (``gradient_accumulation_steps`` set to the step's m, so that DDP's
all-reduce is skipped, ``no_sync``, before the last micro-batch), the loss, ``accelerator.backward(loss)``
(which divides the loss by ``gradient_accumulation_steps``), and ``accelerator.clip_grad_norm_`` once per step.
The targets differ in the loss and the reported loss only:

* ``GA_MEAN_LOSS``: the basic loop of accelerate's guide "Performing gradient accumulation with Accelerate"
  (usage_guides/gradient_accumulation.md) and of ``Accelerator.accumulate``'s docstring: each micro-batch's
  loss is ``cross_entropy(logits, labels, ignore_index=-100)`` (the mean over its non-ignored tokens), the
  reported loss ``accelerator.reduce(rank's token mean, "mean")``. The step then weighs a token of a
  micro-batch with n_k tokens ``1/(dp m n_k)`` instead of ``1/T`` (the mean of per-micro-batch and per-rank
  means): a recorded finding whenever token counts differ, documented by accelerate itself in that guide's
  section "Gradient accumulation on training samples of variable size".
* ``GA_TOKEN_SUM``: that section's fix: the loss is the micro-batch's sum of per-token losses times
  ``gradient_accumulation_steps * accelerator.num_processes / num_items_in_batch`` (the step's non-ignored
  tokens over every rank and micro-batch: the guide gathers it with ``gather_for_metrics``; here it is the
  step's count distcheck passes in ``info.global_tokens``, the same integer), the reported loss
  ``accelerator.reduce(loss sum, "sum") / accelerator.reduce(tokens, "sum")``.

Both name ``axes=("dp_replicate",)``: accelerate's DDP replicates over the whole world, so no other axis is
drawn. Covered: ``Accelerator.prepare`` (DDP), ``accumulate`` (its step counter and ``no_sync``), ``backward``,
``clip_grad_norm_``, ``reduce``; not covered: accelerate's prepared dataloaders (``sync_with_dataloader``),
its optimizer wrapper (distcheck's AdamW steps once per step), mixed precision, FSDP and DeepSpeed plugins::

    distcheck certify distcheck.libs.targets.accelerate:GA_TOKEN_SUM --contract training-step --world-sizes 2
    distcheck certify distcheck.libs.targets.accelerate:GA_MEAN_LOSS --contract training-step --world-sizes 2
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from distcheck.core.vocab import Axis
from distcheck.libs.targets import WorldRun
from distcheck.parallel.layout.contracts import Probe, ProbeSet
from distcheck.parallel.memory.estimators import Estimator
from distcheck.parallel.step.hooks import StepInfo, StepTarget

__all__ = ["DIST", "TITLE", "CERTIFY", "WORLD_CERTIFY", "FLOAT32", "FLOAT16", "BAD_INPUT", "GA_MEAN_LOSS",
           "GA_TOKEN_SUM", "prepare", "accumulate", "backward", "clip", "mean_loss", "report_mean", "token_sum_loss",
           "report_token_mean", "live_accelerator"]

DIST = "accelerate"
TITLE = "accelerate estimate-memory, training with Adam"


def _components(dtype: str, p: int, n: int, o: Mapping[str, Any]) -> dict[str, int]:
    from accelerate.commands.estimate import estimate_training_usage

    c = estimate_training_usage(4 * p, dtype)
    return {"weights": c["model"], "grads": c["gradients"], "optimizer": c["optimizer"], "step": c["step"]}


def _total(dtype: str, p: int, n: int, o: Mapping[str, Any]) -> int:
    from accelerate.commands.estimate import estimate_training_usage

    return max(estimate_training_usage(4 * p, dtype).values())  # the column estimate_command prints


def _printed(dtype: str, p: int, n: int, o: Mapping[str, Any]) -> str:
    from accelerate.utils import convert_bytes

    return convert_bytes(_total(dtype, p, n, o))


def _estimator(dtype: str) -> Estimator:
    return Estimator(f"accelerate.{dtype}", DIST, 0, partial(_total, dtype), components=partial(_components, dtype),
                     printed=partial(_printed, dtype), depends_on_n=False)


FLOAT32 = _estimator("float32")
FLOAT16 = _estimator("float16")

#: the positive control, run before the probes: a valid dtype is accepted with every part positive
_VALID_FIRST = """from accelerate.commands.estimate import estimate_training_usage
_valid = estimate_training_usage(4000, 'float16')
if sorted(_valid) != ['gradients', 'model', 'optimizer', 'step'] or min(_valid.values()) <= 0:
    raise RuntimeError(f"positive control: estimate_training_usage(4000, 'float16') gave {_valid!r}")
"""
BAD_INPUT = ProbeSet("accelerate.training_usage", DIST, _VALID_FIRST, (
    Probe("dtype 'fp16' (an alias it does not know)", "estimate_training_usage(4000, 'fp16')"),
    Probe("dtype 'int8'", "estimate_training_usage(4000, 'int8')"),
), (Probe("dtype 'float16'", "estimate_training_usage(4000, 'float16')"),))

#: the targets of this module and the contract each is certified under
CERTIFY = (("FLOAT32", "memory-estimator"), ("FLOAT16", "memory-estimator"), ("BAD_INPUT", "bad-input"))


#: this rank's Accelerator of the example being run (set by :func:`prepare`)
_LIVE: dict[str, Any] = {}
#: the environment variables accelerate reads a CPU world's rank and size from (torchrun sets them)
_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "OMP_NUM_THREADS", "MASTER_PORT")


def live_accelerator() -> Any:
    """The ``Accelerator`` :func:`prepare` built on this rank. RuntimeError before :func:`prepare` ran."""
    if "accelerator" not in _LIVE:
        raise RuntimeError("no Accelerator on this rank: the target's parallelize (prepare) has not run")
    return _LIVE["accelerator"]


def prepare(model: Any, mesh: Any, layout: Any) -> Any:
    """``parallelize(model, mesh, layout)``: a fresh ``Accelerator()`` on this rank (accelerate's shared state
    reset first, so that no state of an earlier example or world is kept) and ``accelerator.prepare(model)``,
    accelerate's DDP wrapper over the world. accelerate reads a CPU world from ``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` (and sets torch's threads unless ``OMP_NUM_THREADS`` is set): the
    adapter sets them from the running world for the constructor and restores them after. RuntimeError for a
    layout with an axis other than dp_replicate above 1."""
    import os

    import torch
    import torch.distributed as dist
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    if layout.world_size != layout.dp_replicate:
        raise RuntimeError(f"accelerate's DDP replicates over the whole world: layout {layout} is not dp_replicate "
                           "only")
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    world, rank = dist.get_world_size(), dist.get_rank()
    env = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": os.environ.get("LOCAL_RANK", str(rank)),
           "LOCAL_WORLD_SIZE": os.environ.get("LOCAL_WORLD_SIZE", str(world)),
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(torch.get_num_threads())),
           "MASTER_PORT": os.environ.get("MASTER_PORT", "29500")}
    saved = {k: os.environ.get(k) for k in _ENV}
    os.environ.update(env)
    try:
        accelerator = Accelerator(cpu=next(model.parameters()).device.type == "cpu")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if accelerator.num_processes != world:
        raise RuntimeError(f"accelerate sees {accelerator.num_processes} processes in a world of {world}")
    _LIVE["accelerator"] = accelerator
    return accelerator.prepare(model)


def accumulate(model: Any, info: StepInfo) -> Any:
    """``accelerator.accumulate(model)`` with ``gradient_accumulation_steps`` the step's m (accelerate's
    public setter): DDP's all-reduce skipped (``no_sync``) before the last micro-batch of each step."""
    accelerator = live_accelerator()
    accelerator.gradient_accumulation_steps = info.num_microbatches
    return accelerator.accumulate(model)


def backward(loss: Any, model: Any, info: StepInfo) -> None:
    """``accelerator.backward(loss)``: the loss divided by ``gradient_accumulation_steps``, then its backward."""
    live_accelerator().backward(loss)


def clip(parameters: Any, max_norm: float, info: StepInfo) -> Any:
    """``accelerator.clip_grad_norm_(parameters, max_norm)``; returns its total norm."""
    return live_accelerator().clip_grad_norm_(parameters, max_norm)


def mean_loss(logits: Any, labels: Any, info: StepInfo) -> Any:
    """The basic loop's loss: ``cross_entropy(logits, labels, ignore_index=-100)``, the micro-batch's mean."""
    import torch.nn.functional as F

    from distcheck.parallel.step.model import IGNORE_INDEX

    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)


def report_mean(loss_sum: Any, tokens: Any, info: StepInfo) -> tuple[Any, Any]:
    """The basic loop's report: ``accelerator.reduce(loss_sum / tokens, "mean")`` (the mean of the ranks'
    token means) and ``accelerator.reduce(tokens, "sum")``."""
    accelerator = live_accelerator()
    return accelerator.reduce(loss_sum / tokens, reduction="mean"), accelerator.reduce(tokens.clone(), reduction="sum")


def token_sum_loss(logits: Any, labels: Any, info: StepInfo) -> Any:
    """The guide's fix: ``cross_entropy(..., reduction="sum") * gradient_accumulation_steps * num_processes /
    num_items_in_batch`` (``num_items_in_batch`` the step's non-ignored tokens, ``info.global_tokens``)."""
    import torch.nn.functional as F

    from distcheck.parallel.step.model import IGNORE_INDEX

    accelerator = live_accelerator()
    total = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")
    return total * accelerator.gradient_accumulation_steps * accelerator.num_processes / info.global_tokens


def report_token_mean(loss_sum: Any, tokens: Any, info: StepInfo) -> tuple[Any, Any]:
    """The fix's report: ``accelerator.reduce(loss_sum, "sum") / accelerator.reduce(tokens, "sum")``."""
    accelerator = live_accelerator()
    seen = accelerator.reduce(tokens.clone(), reduction="sum")
    return accelerator.reduce(loss_sum.clone(), reduction="sum") / seen, seen


_DDP = (Axis.DP_REPLICATE.value,)
#: accelerate's basic gradient-accumulation loop: the mean of per-micro-batch means (module doc)
GA_MEAN_LOSS = StepTarget(prepare, loss_fn=mean_loss, report_loss=report_mean, clip_grad_norm=clip,
                          accumulate=accumulate, backward=backward, axes=_DDP)
#: the loop of accelerate's "variable size" section: token-weighted (module doc)
GA_TOKEN_SUM = StepTarget(prepare, loss_fn=token_sum_loss, report_loss=report_token_mean, clip_grad_norm=clip,
                          accumulate=accumulate, backward=backward, axes=_DDP)

_PRELOAD = ("torch.nn.parallel", "accelerate")
#: the gradient-accumulation loops on gloo worlds of 2 ranks (dp_replicate = 2, m drawn from 1 to 3)
WORLD_CERTIFY = (
    WorldRun("GA_TOKEN_SUM", "training-step", "accelerate.ga_token_sum", world_sizes=(2,), max_examples=4,
             preload=_PRELOAD),
    WorldRun("GA_MEAN_LOSS", "training-step", "accelerate.ga_mean_loss", world_sizes=(2,), max_examples=4,
             preload=_PRELOAD),
)
