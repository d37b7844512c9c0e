"""Hugging Face transformers' own tensor-parallel plan and FSDP2 as ``training-step`` targets (gloo worlds, CPU).

``LLAMA`` (``LlamaForCausalLM``) and ``MIXTRAL`` (``MixtralForCausalLM``, a mixture of experts) are
:class:`~distcheck.parallel.step.hooks.StepTarget` s with a model factory: distcheck builds the model from a tiny
random config (seeded, float64, the same weights on every rank and in the reference); ``parallelize`` saves it
with ``save_pretrained`` to a temporary folder (rank 0; every rank reads it) and loads it back as a user of
transformers 5 does::

    model = cls.from_pretrained(folder, dtype=torch.float64, distributed_config=DistributedConfig(
        tp_plan="auto", tp_size=tp, fsdp_size=dp_shard, dp_replicate_size=dp_replicate))

transformers then builds its own device mesh ``("pp", "dp_replicate", "fsdp", "tp")`` (CPU: torch's accelerator
type), shards every weight of the model's ``tp_plan`` (Llama: q, k, v, gate and up projections colwise, o and down
rowwise, the embedding rowwise, the head ``colwise_gather_output``; Mixtral: the attention projections only, the
experts replicated over tp) as DTensors, and wraps the model with FSDP2 over ``dp_replicate x fsdp``. No hub access
is needed. The forward is ``model(input_ids=tokens, use_cache=False)``; the ``loss`` hook is the float64
cross-entropy sum of its ``logits`` (a DTensor's ``full_tensor()``; transformers' own loss is its
``ForCausalLMLoss``, which shifts the labels: distcheck's labels are already aligned, so the logits are scored
directly). distcheck's default ``loss_fn`` (sum x dp / T: transformers' FSDP2 averages the gradients over dp), its
``report_loss``, and :func:`clip_by_mesh` complete the step: transformers' tp plan leaves the RMSNorm weights plain
tensors beside DTensor ones, which ``torch.nn.utils.clip_grad_norm_`` refuses ("got mixed torch.Tensor and
DTensor"), so the norm is taken per DTensor mesh and summed in squares (torchtitan's way for experts).
Mixtral's experts run transformers' ``"eager"`` experts implementation: the default grouped GEMM
(``torch._grouped_mm``) has no float64. Mixtral's router load-balancing loss is off
(``output_router_logits=False``, its default), so the step's loss is the token-mean cross-entropy.

What this does not cover: transformers' ``Trainer``; the deprecated ``from_pretrained(..., tp_plan="auto",
device_mesh=...)`` form (it builds a ``DistributedConfig(tp_plan="auto")`` with ``tp_size`` 1, so the model is
loaded whole on every rank and the mesh is not used: a step on it is right and certifies nothing about tensor
parallelism); expert parallelism (``enable_expert_parallel``); sequence parallelism (off by default).

    distcheck certify distcheck.libs.targets.hf_transformers:LLAMA --contract training-step --world-sizes 2,4
    distcheck certify distcheck.libs.targets.hf_transformers:MIXTRAL --contract training-step --world-sizes 2

Mutants that must fail (tests/test_libs_real_models.py, marked ``libs``): ``WRONG_TP_PLAN``, the Llama plan with
``o_proj`` colwise instead of rowwise (passed to ``DistributedConfig`` as a dict: transformers refuses the shapes
in the forward), and ``WRONG_LOSS_SCALE``, the loss summed over the step's tokens with no dp factor (right for
torchtitan's summing FSDP2, half the gradients under transformers' averaging one at dp_shard=2).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from distcheck.libs.targets import WorldRun
from distcheck.parallel.step.hooks import StepInfo, StepTarget

__all__ = ["DIST", "TITLE", "CERTIFY", "WORLD_CERTIFY", "HFConfig", "build_model", "parallelize", "logits_ce_sum",
           "input_ids", "clip_by_mesh", "sum_over_tokens", "LLAMA", "MIXTRAL", "WRONG_TP_PLAN", "WRONG_LOSS_SCALE"]

DIST = "transformers"
TITLE = "Hugging Face transformers: tp_plan and FSDP2"


@dataclass(frozen=True)
class HFConfig:
    """A tiny random config: ``arch`` (``"llama"`` or ``"mixtral"``), the sizes, ``experts`` and ``top_k``
    (Mixtral's ``num_local_experts``, ``num_experts_per_tok``) and ``tp_plan`` overrides (module-name patterns to
    styles, replacing entries of the model's own plan, ``model.tp_plan``, passed to ``DistributedConfig`` as a
    dict instead of ``"auto"``: the mutant's)."""

    arch: str = "llama"
    vocab_size: int = 32
    hidden_size: int = 32
    intermediate_size: int = 32
    num_hidden_layers: int = 2
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    max_position_embeddings: int = 16
    experts: int = 4
    top_k: int = 2
    tp_plan: tuple[tuple[str, str], ...] = field(default=())


def _classes(arch: str) -> tuple[Any, Any]:
    if arch == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        return LlamaConfig, LlamaForCausalLM
    if arch == "mixtral":
        from transformers import MixtralConfig, MixtralForCausalLM

        return MixtralConfig, MixtralForCausalLM
    raise ValueError(f"HFConfig.arch={arch!r}: must be 'llama' or 'mixtral'")


def build_model(cfg: HFConfig) -> Any:
    """``model(config)``: ``LlamaForCausalLM`` or ``MixtralForCausalLM`` of ``cfg``'s sizes, random weights."""
    config_cls, model_cls = _classes(cfg.arch)
    kw: dict[str, Any] = {"vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
                          "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_hidden_layers,
                          "num_attention_heads": cfg.num_attention_heads,
                          "num_key_value_heads": cfg.num_key_value_heads,
                          "max_position_embeddings": cfg.max_position_embeddings}
    if cfg.arch == "mixtral":
        kw.update(num_local_experts=cfg.experts, num_experts_per_tok=cfg.top_k)
    config = config_cls(**kw)
    if cfg.arch == "mixtral":
        config._experts_implementation = "eager"  # torch._grouped_mm, the default, has no float64
    model = model_cls(config)
    model._distcheck_tp_overrides = dict(cfg.tp_plan)  # read by parallelize (the mutant's)
    return model


def parallelize(model: Any, mesh: Any, layout: Any) -> Any:
    """``parallelize(model, mesh, layout)``: ``save_pretrained`` on rank 0 to a folder every rank reads, then
    ``from_pretrained(folder, dtype=torch.float64, distributed_config=DistributedConfig(tp_plan="auto",
    tp_size=tp, fsdp_size=dp_shard, dp_replicate_size=dp_replicate))`` (module doc). transformers builds its own
    mesh of the same rank order as distcheck's (pp, dp_replicate, dp_shard/fsdp, tp)."""
    import logging
    import shutil
    import tempfile
    import warnings

    import torch
    import torch.distributed as dist
    from transformers.distributed.configuration_utils import DistributedConfig
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="transformers")
    box = [tempfile.mkdtemp(prefix="distcheck-hf-") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    folder = str(box[0])
    try:
        if dist.get_rank() == 0:
            model.save_pretrained(folder)
        dist.barrier()
        overrides = getattr(model, "_distcheck_tp_overrides", {})
        # "auto": the model's own plan; the mutant passes that plan as a dict with its entries replaced
        plan: Any = {**dict(model.tp_plan), **overrides} if overrides else "auto"
        config = DistributedConfig(tp_plan=plan, tp_size=layout.tp, fsdp_size=layout.dp_shard,
                                   dp_replicate_size=layout.dp_replicate)
        # the experts' eager loop: the default grouped GEMM (torch._grouped_mm) has no float64
        kw = {"experts_implementation": "eager"} if "mixtral" in type(model).__name__.lower() else {}
        loaded = type(model).from_pretrained(folder, dtype=torch.float64, distributed_config=config, **kw)
        dist.barrier()
    finally:
        if dist.get_rank() == 0:
            shutil.rmtree(folder, ignore_errors=True)
    return loaded.train()


def input_ids(tokens: Any, labels: Any, info: StepInfo) -> dict:
    """The ``batch`` hook: ``model(input_ids=tokens, use_cache=False)``."""
    return {"input_ids": tokens, "use_cache": False}


def logits_ce_sum(output: Any, labels: Any, info: StepInfo) -> Any:
    """The ``loss`` hook: the float64 cross-entropy summed over the non-ignored labels of ``output.logits``
    (``full_tensor()`` of a DTensor)."""
    from distcheck.parallel.step.model import token_loss_sum

    logits = output.logits
    return token_loss_sum(logits.full_tensor() if hasattr(logits, "full_tensor") else logits, labels)


def clip_by_mesh(parameters: Any, max_norm: float, info: StepInfo) -> Any:
    """The clipping hook: torch's ``get_total_norm`` of each group of gradients on one DTensor mesh (and of the plain
    ones: transformers' tp plan leaves the norms' weights plain tensors, and ``torch.nn.utils.clip_grad_norm_``
    refuses a mix of tensors and DTensors), the global norm the square root of the sum of their squares (a plain
    tensor, replicated, counted once), then ``clip_grads_with_norm_`` on every group."""
    import torch

    groups: dict = {}
    for p in parameters:
        if p.grad is not None:
            groups.setdefault(id(getattr(p.grad, "device_mesh", None)), []).append(p)
    squares = []
    for group in groups.values():
        norm = torch.nn.utils.get_total_norm([p.grad for p in group])
        squares.append((norm.full_tensor() if hasattr(norm, "full_tensor") else norm) ** 2)
    norm = torch.stack(squares).sum() ** 0.5
    for group in groups.values():
        torch.nn.utils.clip_grads_with_norm_(group, max_norm, norm)
    return norm


_HOOKS: dict[str, Any] = {"model": build_model, "batch": input_ids, "loss": logits_ce_sum,
                          "clip_grad_norm": clip_by_mesh}
#: LlamaForCausalLM under transformers' tp_plan and FSDP2
LLAMA = StepTarget(parallelize, config=HFConfig("llama"), **_HOOKS)
#: MixtralForCausalLM (4 experts, top-2) under transformers' tp_plan and FSDP2
MIXTRAL = StepTarget(parallelize, config=HFConfig("mixtral"), **_HOOKS)
#: mutant: the Llama plan with the attention output projection colwise (its partial sums never reduced)
WRONG_TP_PLAN = StepTarget(parallelize, config=HFConfig("llama", tp_plan=(("model.layers.*.self_attn.o_proj",
                                                                              "colwise"),)), **_HOOKS)

def sum_over_tokens(output: Any, labels: Any, info: StepInfo) -> Any:
    """A mutant's ``loss_fn``: the micro-batch's loss sum over the step's tokens, no dp factor (torchtitan's
    scaling, right for an FSDP2 that sums; transformers' FSDP2 averages over dp)."""
    return logits_ce_sum(output, labels, info) / info.global_tokens


#: mutant: torchtitan's loss scaling under transformers' averaging FSDP2 (every gradient divided by dp)
WRONG_LOSS_SCALE = StepTarget(parallelize, config=HFConfig("llama"), loss_fn=sum_over_tokens, **_HOOKS)

#: nothing world-free to certify
CERTIFY: tuple[tuple[str, str], ...] = ()
_PRELOAD = ("torch.distributed.fsdp", "torch.distributed.tensor.parallel", "transformers",
            "transformers.models.llama.modeling_llama", "transformers.models.mixtral.modeling_mixtral")
#: the Llama at 2 ranks (tp=2, dp_shard=2) and 4 (dp_shard=2 x tp=2); Mixtral at 2 (tp=2, dp_shard=2)
WORLD_CERTIFY = (
    WorldRun("LLAMA", "training-step", "transformers.llama_tp", world_sizes=(2,), max_examples=2,
             options={"layout": "tp=2"}, preload=_PRELOAD),
    WorldRun("LLAMA", "training-step", "transformers.llama_fsdp", world_sizes=(2,), max_examples=2,
             options={"layout": "dp_shard=2"}, preload=_PRELOAD),
    WorldRun("LLAMA", "training-step", "transformers.llama_fsdp_tp", world_sizes=(4,), max_examples=1,
             options={"layout": "dp_shard=2,tp=2"}, preload=_PRELOAD),
    WorldRun("MIXTRAL", "training-step", "transformers.mixtral_tp", world_sizes=(2,), max_examples=2,
             options={"layout": "tp=2"}, preload=_PRELOAD),
    WorldRun("MIXTRAL", "training-step", "transformers.mixtral_fsdp", world_sizes=(2,), max_examples=2,
             options={"layout": "dp_shard=2"}, preload=_PRELOAD),
)
