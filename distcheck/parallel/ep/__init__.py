"""Expert parallelism: mixture-of-experts layers with the experts spread over ep ranks.

- ``reference`` (numpy, float64): the router (top-k under the two softmax conventions of
  :class:`distcheck.core.vocab.Router`), expert capacity, token dropping by GShard's priority (choice by
  choice, then token order), the Switch/GShard auxiliary load-balancing loss, the experts, the single-device
  MoE layer with GShard's groups, and the expert-parallel layer (all-to-all dispatch, the experts' compute,
  all-to-all combine, dropped tokens through the residual), forward and backward, with the collectives it
  logs; ``models``: the parameters of MoE decoders counted tensor by tensor (Mixtral 8x7B, DeepSeek-V3) and
  their memory per GPU under ep x dp x tp;
- ``forms``: capacity; all-to-all bytes per rank of the dispatch and the combine, forward and backward; total
  and active parameters; memory per GPU;
- ``strategies``, ``properties``, ``mutants``: the expert-parallel layer equals the single-device layer bit
  for bit; tokens are conserved (k choices each, exactly the stated ones dropped); the aux loss equals the
  reference; the all-to-all bytes equal the closed forms;
- ``proofs``: the four all-to-alls send what nccl-tests' all-to-all sends for one rank's buffer.

Sources: Lepikhin et al. 2020, "GShard: Scaling Giant Models with Conditional Computation and Automatic
Sharding" (arXiv:2006.16668), §2.2 and Algorithm 1; Fedus et al. 2021, "Switch Transformers: Scaling to
Trillion Parameter Models with Simple and Efficient Sparsity" (arXiv:2101.03961), §2.1-2.3, eq. 1-6; Jiang
et al. 2024, "Mixtral of Experts" (arXiv:2401.04088); DeepSeek-AI 2024, "DeepSeek-V3 Technical Report"
(arXiv:2412.19437).

Public API: this package, ``distcheck.parallel.ep``: the names of ``__all__``, served on first access from
its internal modules (``reference``, ``models``; numpy only, never torch); importing it imports nothing
more. Its closed forms are served by :mod:`distcheck.closed_form`, its strategies by
:mod:`distcheck.strategies`, its properties by :mod:`distcheck.props` and its mutants by
:mod:`distcheck.mutants`.
"""

from distcheck.core.face import face

__all__ = [
    "ROUTERS", "Routing", "rowdot", "softmax", "route", "expert_capacity", "assign_slots", "aux_loss", "expert_mlp",
    "moe_layer", "moe_layer_backward", "ep_moe_layer", "ep_moe_layer_backward", "expert_shards", "check_moe",
    "MoEConfig", "MIXTRAL_8X7B", "DEEPSEEK_V3", "MODELS", "param_tensors", "param_counts", "params_per_gpu",
]

__getattr__, __dir__ = face(__name__, __all__, sources=("reference", "models"))
