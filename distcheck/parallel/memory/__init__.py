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

Public paths: :mod:`distcheck.memory`, :mod:`distcheck.forms.memory`.
"""
