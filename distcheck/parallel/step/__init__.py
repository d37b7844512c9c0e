"""A whole training step under composed parallelism: FSDP2 (``dp_shard``) x HSDP replicas
(``dp_replicate``) x tensor parallelism (``tp``) x pipeline stages (``pp``) x context parallelism (``cp``) x
expert parallelism (``ep``, borrowed from dp x cp in torchtitan's or Megatron's placement) x gradient
accumulation, with the token-mean loss, the MoE load-balancing loss, grad-norm clipping and the AdamW state,
against the single-device float64 step, or in float32 and bf16 mixed precision against the single-device step in
the same precision.

- ``reference``: numpy references: the global token-mean loss under dp x gradient accumulation, the
  global grad norm from any sharding (replicated parameters counted once), torch's clipping
  coefficient, the bytes each composition communicates per step (``StepLayout``, ``Placement``);
- ``forms``: ``step.loss.token_weight``, ``step.loss.mean_of_means_weight``, ``step.grad_norm.copies``,
  ``step.clip.scale``, ``step.comm_bytes_per_rank.{dp,tp}``;
- ``proofs``: the step's bytes are ZeRO-3's and sequence parallelism's, the token weight is the mean of
  means' exactly on equal micro-batches;
- ``strategies``, ``properties``, ``mutants``: the step's reductions on simulated worlds, and one mutant
  per public bug class (the local shard's norm, tp-replicated parameters counted tp times, the mean of
  per-micro-batch means, gradients scaled by the world size, norm gradients not summed across tp, the
  loss of rank 0's shard);
- ``model``: the tiny Llama-style decoder (torch, built on first use; optional MoE layers, DeepSeek-V3's and
  torchtitan's shape, and RoPE) and its cut to a pipeline stage;
- ``contracts`` (+ ``harness``, the rank side and the references; ``compare``, the comparisons; ``layouts``, the
  compositions drawn): the ``training-step`` contract, whose target is a torchtitan-style
  ``parallelize(model, mesh, layout) -> model`` or a :class:`~.hooks.StepTarget`;
- ``bound``: the float64 bound; ``precision``: the precisions (float64, float32, ``bf16-fsdp``,
  ``bf16-autocast``) and the criterion that holds a low-precision step to the single-device step in the same
  precision;
- ``trace`` (+ ``mapping``, ``divergence``): the first divergence of a failing step: its shrunk case replayed
  with every tensor recorded on every rank and in the reference, mapped back to full tensors, the first that
  leaves its bound named;
- ``hooks``: the step's overridable hooks (loss, reported loss, grad-norm clipping, the micro-batch's
  accumulation context and backward, the model's inputs and its own loss) and their defaults, and the user's
  own model (``StepTarget(model=..., config=...)``);
- ``plans``: torch's composition (FSDP2 x tp x cp x ep: torchtitan's plan, distcheck's ring attention,
  torchtitan's ``ExpertParallel``), with torch's ``context_parallel`` instead of the ring, and the plain DDP
  accumulation loop.

Sources: Rajbhandari et al. 2020, "ZeRO" (§7); Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models" (§4.2.2); torch's ``clip_grad_norm_`` and FSDP2
``fully_shard``; torchtitan's ``parallelize_llama`` and ``ParallelDims``; the public bug reports
pytorch/torchtitan#596, pytorch/pytorch#170862, meta-pytorch/torchtune#2420 and Hugging Face's
"Fixing Gradient Accumulation" (2024); DeepSeek-AI 2024, "DeepSeek-V3 Technical Report" (arXiv:2412.19437),
§2.1.2; Fedus et al. 2021, "Switch Transformers", eq. 4-6; torchtitan's ``ExpertParallel`` and
pytorch/torchtitan#1551; "The Llama 3 Herd of Models", §3.3.2 (head-tail cp chunks).

Public API: this package, ``distcheck.parallel.step``: the names of ``__all__``, served on first
access from its internal modules (``reference``, ``model``, ``hooks``, ``contracts``); importing it imports
nothing more. Its closed forms are served by :mod:`distcheck.closed_form`, its strategies by
:mod:`distcheck.strategies`, its properties by :mod:`distcheck.props` and its mutants by
:mod:`distcheck.mutants`.
"""

from distcheck.core.face import face

__all__ = [
    "CLIP_EPS", "StepLayout", "Placement", "token_mean_loss", "token_count", "global_grad_norm", "copies",
    "local_shard", "sharded_grad_norm", "clip_scale", "step_comm_bytes", "NORM_EPS", "TinyConfig",
    "build_model", "token_loss_sum", "IGNORE_INDEX", "pipeline_stage", "stage_of", "StepInfo", "StepTarget",
    "all_reduce_dp", "torch_clip", "dp_groups", "as_float", "TrainingStep", "BOUND", "layouts", "parse_layout",
    "PP_SCHEDULES", "AXES", "no_accumulate", "loss_backward", "token_ids", "cross_entropy_sum", "call_model",
    "MAX_LEN_FIELDS", "expert_mesh", "load_balance_loss", "moe_layers", "EXPERT_AXES", "FLAT_AXES",
    "ROPE_THETA", "rotary", "causal_attention", "PRECISIONS", "Precision", "MIXED_MODES", "UNIT_ROUNDOFF", "FLOOR",
    "C_TP", "FLOOR_TP", "get_precision", "precisions_for", "reordered", "precision_bounds", "autocast_for",
    "autocast_hooks", "floating_to", "TIED_NAMES", "all_reduce_tied", "check_hooks", "no_finalize", "stages_of",
    "tied_copies", "tied_embedding_clip", "PipelineInfo", "MIN_SEQ_LEN", "user_config_limits",
]

__getattr__, __dir__ = face(__name__, __all__, sources=("reference", "model", "hooks", "contracts", "precision"))
