"""Training-state memory per GPU: weights, gradients and optimizer state, in exact bytes.

- ``reference``: bytes-per-parameter conventions (16 for mixed-precision Adam, 18 with fp32
  gradients, 8-bit Adam, SGD with momentum, moments only), the state split over tp x pp,
  and the fewest GPUs or the smallest TP (x PP) that fit a budget;
- ``forms``: the same quantities as sympy closed forms (``memory.*``).

Sources: Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models" (arXiv:1910.02054), §3 (16 bytes per parameter under mixed-precision
Adam); Shoeybi et al. 2019, "Megatron-LM" (arXiv:1909.08053); the lesson "Scaling and
distributed training" (adapted in part from *AI Engineering from Scratch*), section 3,
"Memory per GPU". Sharding over data parallelism is the ``zero`` package.

Public API: this package, ``distcheck.parallel.memory``: the names of ``__all__``, served on first
access from its internal modules (``reference``). Every module inside the package is internal; its
closed forms are served by :mod:`distcheck.closed_form`, its strategies by
:mod:`distcheck.strategies`, its properties by :mod:`distcheck.props` and its mutants by
:mod:`distcheck.mutants`.
"""

from distcheck.core.face import face

__all__ = [
    "BytesPerParam", "CONVENTIONS", "bytes_per_param", "train_state_bytes", "weights_bytes", "grads_bytes",
    "optimizer_bytes", "min_tp", "min_tp_pp", "min_gpus", "MAX_NUM_LAYERS",
]

__getattr__, __dir__ = face(__name__, __all__, sources=("reference",))
