"""torchtitan's own Llama 3 and its own ``parallelize_llama`` as a ``training-step`` target (gloo worlds, CPU).

``LLAMA`` is a :class:`~distcheck.parallel.step.hooks.StepTarget` with a model factory: distcheck builds the model
(seeded, float64, the same weights on every rank and in the reference), hands it to torchtitan's
``torchtitan.models.llama3.parallelize_llama`` (torchtitan 0.3: its tensor-parallel plan from
``set_llama3_sharding_config``, sequence parallel norms, loss-parallel logits, then FSDP2 through
``apply_fsdp_to_decoder``, which also disables FSDP2's gradient division), steps it with torchtitan's loss
scaling and torchtitan's ``clip_grad_norm_``, and holds every parameter, AdamW moment, the reported loss and
norm to the same model stepped on one device in float64. Under pp the target's ``pipeline`` hook (:func:`pipeline`)
hands the whole model to torchtitan's own ``torchtitan.distributed.pipeline_parallel.pipeline_llm``: torchtitan's
split into stages (each a copy of the model with what the stage does not run set to None), ``parallelize_llama``
on each stage, torch's ``PipelineStage`` and torchtitan's schedule (``GPipe`` or ``1F1B``, as drawn), which
distcheck steps; torchtitan's ``clip_grad_norm_`` then takes the pp mesh.

The model is torchtitan's Llama 3 debug model (``llama3_configs["debugmodel"]``: ``Llama3Model`` with fused
``wqkv``, GQA attention with ``ComplexRoPE`` (llama scaling, theta 500000), SwiGLU feed-forward of
``compute_ffn_hidden_dim(dim, multiple_of=256)``, RMSNorm, untied head, torchtitan's own initialisers), built by
:func:`build_llama` from torchtitan's ``_build_llama3_layers`` with the sizes of a :class:`TitanLlamaConfig`:
:data:`DEBUGMODEL` is the debug model's (dim 256, 16 heads, 6 layers, vocabulary 2048, 6.2 M parameters),
:data:`SMALL` the same architecture at dim 32, 4 heads, 2 layers, vocabulary 64 (what ``distcheck libs`` runs:
every example gathers every parameter and AdamW moment of every rank to a float64 reference, and two CPU cores
do that for the debug model in minutes, not seconds).

What is substituted to run it on CPU in float64 (each named in ``distcheck libs``' row and docs/LIBRARIES.md):

1. ``import torchtitan.models`` imports ``triton``: the libs extra installs it (it imports without a GPU).
2. torchtitan's ``device_type`` falls back to ``"cuda"`` without an accelerator: ``ParallelDims.build_mesh``
   reads it from its module, so the adapter sets ``torchtitan.distributed.parallel_dims.device_type = "cpu"``.
3. The debug model's inner attention is FlexAttention (no backward on CPU; the varlen backend needs CUDA): each
   block's ``inner_attention`` is torchtitan's own ``ScaledDotProductAttention`` (causal, the same
   ``(q, k, v)`` call), so no attention mask is built and every sequence is one causal document.
4. torchtitan's ``TORCH_DTYPE_MAP`` has no float64 and its ``TrainingConfig`` names bfloat16 or float32 for FSDP2's
   mixed precision: the adapter adds ``"float64"`` to the map and passes ``mixed_precision_param =
   mixed_precision_reduce = "float64"``, so FSDP2 casts nothing. In float64 FSDP2 reduce-scatters with SUM (its
   ``_get_gradient_divide_factors`` takes the pre/post-divide path for any dtype but float32 and bfloat16), so
   the ``ReduceOp.PREMUL_SUM`` that gloo lacks (issued in float32 once torchtitan sets the divide factor to 1) is
   never called: no emulation is needed here.
5. torchtitan's ``CrossEntropyLoss`` computes in float32 (``pred.float()``): the ``loss`` hook is the float64
   cross-entropy sum of the logits (gathered from torchtitan's loss-parallel ``Shard(-1)`` DTensor with
   ``full_tensor()``), and ``loss_fn`` is torchtitan's trainer's scaling: the micro-batch's sum divided by the
   step's global non-ignored tokens, with no dp factor (torchtitan disables FSDP2's division by the dp size).
   Under pp the same scaling is the ``loss_fn`` handed to ``pipeline_llm``, in torchtitan's ``(loss, extra)``
   convention, with the step's token count closed over (torchtitan's trainer passes it as the schedule's
   ``loss_kwargs``).
6. torchtitan's SPMD backend is ``"partial_dtensor"`` (DTensor over tp, ``set_spmd_backend``), not its default
   ``"spmd_types"``.
7. ``ComplexRoPE.apply_rotary_emb`` rounds q and k to float32 (``query.float()``) and multiplies them by its
   complex64 cache: in complex64 the product's rounding depends on the kernel (vectorized, with fused
   multiply-adds, or scalar on a short row), which changes with the heads a tp rank holds (at tp = 4 a rank's one
   head differed from the single-device model's four by 1.5e-8 at the rotary output, a float32 rounding the
   float64 bounds rightly refuse). Each ``ComplexRoPE`` of the model (:func:`build_llama`, so the ranks and the
   reference alike) applies the same rotation by the same cache in complex128 (:func:`rotary_float64`: the cache's
   complex64 values cast exactly, q and k not rounded), torchtitan's code otherwise.

Not covered: torchtitan's interleaved and zero-bubble schedules (several stages per rank: distcheck steps one
stage per rank, GPipe and 1F1B) and its pipeline schedule CSVs; activation checkpointing and ``torch.compile``
(off); context parallelism.

    distcheck certify distcheck.libs.targets.torchtitan_llama:LLAMA --contract training-step --world-sizes 2,4

Mutants that must fail (tests/test_libs_real_models.py, marked ``libs``): ``WRONG_LOSS_SCALE``, distcheck's default
loss (times dp, for an FSDP2 that averages) under torchtitan's FSDP2 that sums: every gradient dp times too large,
and the first divergence names the reduced gradient of ``tok_embeddings.weight``; ``WRONG_TP_PLAN``,
``attention.wo`` left off torchtitan's plan: its weight stays a plain tensor beside the heads' DTensor shards,
which DTensor refuses in the forward ("got mixed torch.Tensor and DTensor"); ``WRONG_PP_CLIP``, torchtitan's
``clip_grad_norm_`` called without ``pp_mesh`` under pp (pytorch/torchtitan#596): each stage reports and clips by its
own stage's norm, and the first divergence is the grad norm the clipping hook returned.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from distcheck.core.vocab import Schedule
from distcheck.parallel.step.hooks import PipelineInfo, StepInfo, StepTarget

__all__ = ["TitanLlamaConfig", "DEBUGMODEL", "SMALL", "build_llama", "rotary_float64", "parallelize", "titan_loss",
           "logits_ce_sum",
           "LLAMA", "LLAMA_DEBUGMODEL", "WRONG_LOSS_SCALE", "WRONG_TP_PLAN", "WRONG_PP_CLIP", "SPMD_BACKEND",
           "PRELOAD", "titan_clip_grad_norm", "pipeline", "TITAN_SCHEDULES"]

#: torchtitan's SPMD backend the target runs (module doc, item 6)
SPMD_BACKEND = "partial_dtensor"
#: what a rank pool's parent imports before forking its ranks
PRELOAD = ("torch.distributed.fsdp", "torch.distributed.tensor.parallel", "torch.distributed.pipelining",
           "torchtitan.distributed.utils", "torchtitan.distributed.pipeline_parallel", "torchtitan.models.llama3")


def titan_clip_grad_norm(parameters: Any, max_norm: float, info: StepInfo) -> Any:
    """The step's clipping hook: ``torchtitan.distributed.utils.clip_grad_norm_`` as torchtitan's trainer calls
    it (``foreach=True``; ``pp_mesh`` the mesh's pp dimension when pp > 1, else None). Returns its norm."""
    from torchtitan.distributed.utils import clip_grad_norm_

    pp_mesh = info.mesh["pp"] if info.layout.pp > 1 else None
    return clip_grad_norm_(list(parameters), max_norm, foreach=True, pp_mesh=pp_mesh)



@dataclass(frozen=True)
class TitanLlamaConfig:
    """The sizes of torchtitan's Llama 3 debug-model architecture (:func:`build_llama`): ``dim``, ``n_heads``,
    ``n_layers``, ``vocab_size``, ``ffn_multiple_of`` (the SwiGLU width is ``compute_ffn_hidden_dim(dim,
    multiple_of=ffn_multiple_of)``), ``max_seq_len`` (the RoPE cache's positions: the longest sequence drawn;
    torchtitan's is 131072) and ``enable_sp`` (sequence parallel norms, torchtitan's default)."""

    dim: int = 32
    n_heads: int = 4
    n_layers: int = 2
    vocab_size: int = 64
    ffn_multiple_of: int = 32
    max_seq_len: int = 16
    enable_sp: bool = True


#: the debug model's own sizes (``torchtitan.models.llama3._debugmodel``)
DEBUGMODEL = TitanLlamaConfig(dim=256, n_heads=16, n_layers=6, vocab_size=2048, ffn_multiple_of=256, max_seq_len=16)
#: the same architecture, small enough for ``distcheck libs`` on two CPU cores
SMALL = TitanLlamaConfig()


def _model_config(cfg: TitanLlamaConfig) -> Any:
    """torchtitan's ``Llama3Model.Config`` of ``cfg``: ``_debugmodel``'s body with ``cfg``'s sizes, each block's
    inner attention torchtitan's ``ScaledDotProductAttention`` and the sharding config torchtitan's trainer sets
    (``set_llama3_sharding_config``)."""
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm, compute_ffn_hidden_dim
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3 import (
        _EMBEDDING_INIT,
        _NORM_INIT,
        Llama3Model,
        _build_llama3_layers,
        _output_linear_init,
    )
    from torchtitan.models.llama3.sharding import set_llama3_sharding_config

    dim, vocab = cfg.dim, cfg.vocab_size
    mc = Llama3Model.Config(
        dim=dim, vocab_size=vocab,
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init=_EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=dim, param_init=_NORM_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=_output_linear_init(dim)),
        layers=_build_llama3_layers(
            fuse_qkv=True, n_layers=cfg.n_layers, dim=dim, n_heads=cfg.n_heads,
            hidden_dim=compute_ffn_hidden_dim(dim, multiple_of=cfg.ffn_multiple_of),
            rope=ComplexRoPE.Config(dim=dim // cfg.n_heads, max_seq_len=cfg.max_seq_len, theta=500000,
                                    scaling="llama"),
            attn_backend="flex"))
    for layer in mc.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    set_llama3_sharding_config(mc, enable_sp=cfg.enable_sp)
    return mc


def rotary_float64(query: Any, key: Any, rope_cache: Any) -> tuple[Any, Any]:
    """``ComplexRoPE.apply_rotary_emb`` in complex128 (substitution 7): q and k ``(batch, seq_len, heads,
    head_dim)`` read as ``head_dim / 2`` complex pairs of adjacent dims, each multiplied by ``rope_cache`` (the
    complex64 cache broadcast, cast exactly to complex128), returned in q's and k's dtype."""
    import torch

    cache = rope_cache.to(torch.complex128)

    def rotate(x: Any) -> Any:
        pairs = torch.view_as_complex(x.to(torch.float64).reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(pairs * cache).flatten(3).type_as(x)

    return rotate(query), rotate(key)


def build_llama(cfg: TitanLlamaConfig) -> Any:
    """``model(config)``: torchtitan's ``Llama3Model`` of ``cfg`` (:func:`_model_config`), built and initialised
    with torchtitan's own ``init_weights`` (distcheck calls it under the case's seed, float64 the default dtype),
    each ``ComplexRoPE`` applying its rotation in complex128 (:func:`rotary_float64`, substitution 7)."""
    from torchtitan.models.common import ComplexRoPE

    model = _model_config(cfg).build()
    model.init_weights(buffer_device=None)
    for module in model.modules():
        if isinstance(module, ComplexRoPE):
            module.apply_rotary_emb = rotary_float64  # the instance's: torchtitan calls self.apply_rotary_emb
    return model


#: torchtitan's ParallelDims built, by world, rank and degrees (each creates process groups: once per world)
_DIMS: dict = {}


def _parallel_dims(layout: Any) -> Any:
    """torchtitan's ``ParallelDims`` of ``layout`` (dp_replicate, dp_shard, tp, pp; cp = ep = 1) with its meshes
    built on CPU (substitution 2), once per world and rank."""
    import logging

    import torch.distributed as dist
    import torchtitan.distributed.parallel_dims as pdm

    logging.getLogger("torchtitan").setLevel(logging.ERROR)
    key = (id(dist.group.WORLD), dist.get_rank(), layout.dp_replicate, layout.dp_shard, layout.tp, layout.pp)
    if key not in _DIMS:
        pdm.device_type = "cpu"
        dims = pdm.ParallelDims(dp_replicate=layout.dp_replicate, dp_shard=layout.dp_shard, cp=1, tp=layout.tp,
                                pp=layout.pp, ep=1, world_size=dist.get_world_size(), spmd_backend=SPMD_BACKEND)
        dims.build_mesh()
        _DIMS[key] = dims
    return _DIMS[key]


def parallelize(model: Any, mesh: Any, layout: Any, *, drop: tuple[str, ...] = ()) -> Any:
    """``parallelize(model, mesh, layout)``: torchtitan's ``parallelize_llama(model, parallel_dims=...,
    training=TrainingConfig(mixed_precision_param="float64", mixed_precision_reduce="float64"),
    parallelism=ParallelismConfig(spmd_backend="partial_dtensor"), compile_config=CompileConfig(),
    ac_config=None, dump_folder=...)`` on torchtitan's own meshes of the same degrees (distcheck's ``mesh`` has the
    same rank order, torchtitan's). ``drop``: module-name suffixes whose sharding config is removed first (the
    mutant :data:`WRONG_TP_PLAN`)."""
    import tempfile

    from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.models.llama3 import parallelize_llama

    _setup()
    dims = _parallel_dims(layout)
    for name, module in model.named_modules():
        if drop and name.endswith(drop):
            module._sharding_config = None
    training = TrainingConfig(mixed_precision_param="float64", mixed_precision_reduce="float64")
    with tempfile.TemporaryDirectory() as dump:
        return parallelize_llama(model, parallel_dims=dims, training=training,
                                 parallelism=ParallelismConfig(spmd_backend=SPMD_BACKEND),
                                 compile_config=CompileConfig(), ac_config=None, dump_folder=dump)


def _setup() -> None:
    """torchtitan's globals the target sets on each rank: float64 in ``TORCH_DTYPE_MAP`` (substitution 4) and the
    SPMD backend (substitution 6)."""
    import torch
    import torchtitan.config as tc
    from torchtitan.distributed.utils import set_spmd_backend

    tc.TORCH_DTYPE_MAP.setdefault("float64", torch.float64)
    set_spmd_backend(SPMD_BACKEND)


#: torchtitan's names of the schedules distcheck draws (:class:`~distcheck.core.vocab.Schedule`)
TITAN_SCHEDULES = {Schedule.GPIPE.value: "GPipe", Schedule.ONE_F_ONE_B.value: "1F1B"}


def pipeline(model: Any, mesh: Any, layout: Any, info: PipelineInfo) -> tuple[Any, list]:
    """The ``pipeline`` hook: torchtitan's own ``pipeline_llm(model, parallel_dims=..., training=TrainingConfig(
    local_batch_size=m * microbatch_size, mixed_precision_param="float64", mixed_precision_reduce="float64"),
    parallelism=ParallelismConfig(pipeline_parallel_degree=pp, pipeline_parallel_microbatch_size=microbatch_size,
    pipeline_parallel_schedule="GPipe" | "1F1B", spmd_backend="partial_dtensor"), compile_config=CompileConfig(),
    ac_config=None, dump_folder=..., device=..., model_config=model.config, parallelize_fn=parallelize_llama,
    loss_fn=...)`` on torchtitan's ``ParallelDims`` of the layout (pp included): torchtitan's split (its
    ``_generate_llm_fqn_per_model_part``: the embedding counted as a layer on the first stage, the norm and head on
    the last), each stage a deep copy of the whole model with what it does not run set to None, parallelized by
    torchtitan's ``parallelize_llama`` (TP, FSDP2) and wrapped in torch's ``PipelineStage``, and torchtitan's
    schedule (``scale_grads=False``). ``loss_fn`` is torchtitan's convention, ``(loss, extra)``, around distcheck's
    stage loss (``info.loss``: :func:`titan_loss` of the last stage's logits). Returns ``(schedule,
    model_parts)``."""
    import tempfile

    from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.distributed.pipeline_parallel import pipeline_llm
    from torchtitan.models.llama3 import parallelize_llama

    _setup()
    dims = _parallel_dims(layout)
    m, mbs = info.microbatches, info.microbatch_size
    training = TrainingConfig(local_batch_size=m * mbs, mixed_precision_param="float64",
                              mixed_precision_reduce="float64")
    parallelism = ParallelismConfig(pipeline_parallel_degree=layout.pp, pipeline_parallel_microbatch_size=mbs,
                                    pipeline_parallel_schedule=TITAN_SCHEDULES[info.schedule],
                                    spmd_backend=SPMD_BACKEND)

    def loss_fn(output: Any, labels: Any, **_: Any) -> tuple[Any, None]:
        return info.loss(output, labels), None

    with tempfile.TemporaryDirectory() as dump:
        schedule, parts, _, _ = pipeline_llm(
            model, parallel_dims=dims, training=training, parallelism=parallelism, compile_config=CompileConfig(),
            ac_config=None, dump_folder=dump, device=info.device, model_config=model.config,
            parallelize_fn=parallelize_llama, loss_fn=loss_fn)
    return schedule, parts


def logits_ce_sum(output: Any, labels: Any, info: StepInfo) -> Any:
    """The ``loss`` hook: the float64 cross-entropy summed over the non-ignored labels of the logits, gathered from
    torchtitan's loss-parallel ``Shard(-1)`` DTensor (``full_tensor()``) when tp > 1 (substitution 5)."""
    from distcheck.parallel.step.model import token_loss_sum

    full = output.full_tensor() if hasattr(output, "full_tensor") else output
    return token_loss_sum(full, labels)


def titan_loss(output: Any, labels: Any, info: StepInfo) -> Any:
    """``loss_fn``: torchtitan's trainer's scaling, the micro-batch's per-token loss sum over the step's global
    non-ignored tokens (``local SUM loss / global_valid_tokens``), no dp factor: torchtitan's FSDP2 sums the
    ranks' gradients (``disable_fsdp_gradient_division``)."""
    return logits_ce_sum(output, labels, info) / info.global_tokens


def _clip(parameters: Any, max_norm: float, info: StepInfo) -> Any:
    return titan_clip_grad_norm(parameters, max_norm, info)


def _clip_without_pp_mesh(parameters: Any, max_norm: float, info: StepInfo) -> Any:
    """The mutant :data:`WRONG_PP_CLIP`'s clipping: torchtitan's ``clip_grad_norm_`` without ``pp_mesh`` under pp."""
    from torchtitan.distributed.utils import clip_grad_norm_

    return clip_grad_norm_(list(parameters), max_norm, foreach=True, pp_mesh=None)


def _without_wo(model: Any, mesh: Any, layout: Any) -> Any:
    return parallelize(model, mesh, layout, drop=("attention.wo",))


_OWN: dict[str, Any] = {"model": build_llama, "loss": logits_ce_sum, "clip_grad_norm": _clip, "pipeline": pipeline}
#: torchtitan's Llama 3 debug-model architecture (:data:`SMALL` sizes) under its own parallelize_llama
LLAMA = StepTarget(parallelize, loss_fn=titan_loss, config=SMALL, **_OWN)
#: the same at the debug model's own sizes (:data:`DEBUGMODEL`; the benchmark's, minutes per example on 2 cores)
LLAMA_DEBUGMODEL = StepTarget(parallelize, loss_fn=titan_loss, config=DEBUGMODEL, **_OWN)
#: mutant: distcheck's default loss_fn (sum x dp / T, for an FSDP2 that averages) under torchtitan's summing FSDP2
WRONG_LOSS_SCALE = StepTarget(parallelize, config=SMALL, **_OWN)
#: mutant: ``attention.wo`` left off torchtitan's tensor-parallel plan
WRONG_TP_PLAN = StepTarget(_without_wo, loss_fn=titan_loss, config=SMALL, **_OWN)
#: mutant: torchtitan's ``clip_grad_norm_`` called without ``pp_mesh`` under pp (pytorch/torchtitan#596): each
#: stage clips by its own stage's norm
WRONG_PP_CLIP = StepTarget(parallelize, loss_fn=titan_loss, config=SMALL,
                           **dict(_OWN, clip_grad_norm=_clip_without_pp_mesh))
