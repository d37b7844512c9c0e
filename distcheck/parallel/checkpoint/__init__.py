"""Checkpoints: save under one layout, load under another, bitwise; an interrupted save loses nothing.

- ``reference`` (numpy): the shards of a tensor under a layout (DDP replicated, FSDP2's dim-0 shards,
  DTensor tensor parallelism's per-tensor dimension; torch.chunk's uneven split), a checkpoint's items and
  their offsets, loading under another layout at another world size, Adam's step, a checkpoint's bytes per
  rank and in total; ``swap``: a checkpoint folder written whole or not at all (staging, rename, then the
  ``LATEST`` pointer swapped atomically);
- ``forms``: bytes of a checkpoint in total and per rank under each layout, with and without Adam's
  state; mixed-precision Adam's bytes per parameter;
- ``strategies``, ``properties``, ``mutants``: resharding is bitwise, the step count survives and the next
  step equals the saved run's, the bytes are the closed forms, a save killed at any byte leaves the
  previous checkpoint complete;
- ``contracts`` (+ ``harness``, the rank side; ``plans``, torch.distributed.checkpoint as a target):
  ``checkpoint``, a user's ``save(state, path)`` / ``load(state, path)`` certified on a real world, loaded
  on the saving world or on another (N - 1 ranks, 2N up to 4: a pool per world size);
  ``restart_contracts`` (+ ``stateful``, the rank side): ``checkpoint-restart``, a whole training state as a
  DCP ``Stateful`` (model, optimizer, LR scheduler, RNG, data-loader position, step) restarting a run on
  another world bitwise;
  ``restart``: a torchrun run SIGKILLed at step k and restarted from its checkpoint (``--max-restarts``);
  ``checks``: its rows of ``distcheck check``; ``findings``: what torch.distributed.checkpoint does not
  guarantee.

Sources: torch.distributed.checkpoint docs ("Distributed Checkpoint - torch.distributed.checkpoint");
Zhao et al. 2023, "PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel", §3.2.1;
Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", §3.1;
Kingma and Ba 2015, "Adam: A Method for Stochastic Optimization", Algorithm 1.

Public API: this package, ``distcheck.parallel.checkpoint``: the names of ``__all__``, served on first
access from its internal modules (``reference``, numpy only; ``swap``, the standard library); importing it
imports nothing more. Its closed forms are served by :mod:`distcheck.closed_form`, its strategies by
:mod:`distcheck.strategies`, its properties by :mod:`distcheck.props` and its mutants by
:mod:`distcheck.mutants`.
"""

from distcheck.core.face import face

__all__ = [
    "LAYOUTS", "MOMENTS", "STEP_BYTES", "Checkpoint", "Loaded", "layout_dims", "shard_bounds", "shard",
    "save", "load", "assemble", "adam_step", "checkpoint_bytes", "data_bytes",
    "LAYOUTS_2D", "TP_2D", "layouts_at", "mesh_2d", "shard_boxes",
    "POINTER", "MANIFEST", "save_swap", "load_swap", "write_chunks",
]

__getattr__, __dir__ = face(__name__, __all__, sources=("reference", "swap"))
