"""torchtitan's ``ParallelDims`` (rank-layout and bad-input contracts, through the fake backend) and its
``CheckpointManager`` (checkpoint contract, on gloo worlds).

``torchtitan.distributed.parallel_dims.ParallelDims(dp_replicate, dp_shard, cp, tp, pp, ep,
world_size).build_mesh()`` builds the meshes every rank uses. The adapter draws degrees
(``dp_shard`` sometimes -1, derived from the world size), builds the meshes as every rank
of a fake world in turn (:func:`distcheck.engine.fake.run_fake`: no process starts, no
collective runs) and collects, for each mesh name, the group each rank belongs to. They are
compared with :func:`distcheck.parallel.layout.torchtitan_layout` and, for tp, cp, pp and the whole
data-parallel group (``batch``), with :class:`distcheck.parallel.layout.ParallelConfig` with
``dp = dp_replicate * dp_shard`` under the same order.

    distcheck certify distcheck.libs.targets.torchtitan:PARALLEL_DIMS --contract rank-layout
    distcheck certify distcheck.libs.targets.torchtitan:BAD_INPUT --contract bad-input

``CLIP_GRAD_NORM`` (training-step contract, on gloo worlds): torch's composition
(:func:`distcheck.parallel.step.plans.fsdp2_tp`: FSDP2 over the dp axes, torchtitan's Llama tensor-parallel
plan over tp, pipeline stages under pp) stepped with torchtitan's own
``torchtitan.distributed.utils.clip_grad_norm_(parameters, max_norm, foreach=True, pp_mesh=...)``, called as
torchtitan's trainer calls it: ``pp_mesh`` is the mesh's pp dimension under pipeline parallelism and None
without it (``parallel_dims.get_optional_mesh("pp")``). The contract holds the reported norm to the global
norm (replicated parameters counted once) and the clipped gradients, parameters and AdamW state to the
single-device float64 step. ``distcheck libs`` certifies it at world size 2 under three pinned layouts,
``dp_shard=2`` and ``tp=2`` (no pp mesh: the norm is a DTensor over the FSDP2 shards, or over the tp shards
with the norms' weights replicated) and ``pp=2`` (the pp mesh: each stage's norm summed over the pipeline,
pytorch/torchtitan#596); at world size 4 every composition is drawn::

    distcheck certify distcheck.libs.targets.torchtitan:CLIP_GRAD_NORM --contract training-step --world-sizes 2 \
        --option layout=pp=2

Checkpoint manager: ``CHECKPOINT_MANAGER`` is ``torchtitan.components.checkpoint.CheckpointManager`` as a
target of the ``checkpoint`` contract (:mod:`distcheck.parallel.checkpoint.contracts`), on real gloo worlds
(CPU): every rank builds a manager with ``CheckpointManager.Config(enable=True, folder="checkpoint",
interval=1, keep_latest_k=0, async_mode="disabled", last_save_model_only=False)``, ``base_folder`` the
contract's shared folder, ``model_parts`` one part whose state is the contract's model state dict
(``get_state_dict``'s FQN keys: ``ModelWrapper`` calls only ``state_dict()`` and ``load_state_dict(sd,
strict=False)`` on a part), ``optimizers`` a Stateful holding torch's FQN-keyed optimizer state dict,
``dataloader`` and ``lr_schedulers`` None, ``states={}``, ``sd_adapter=None``. ``save`` is
``manager.save(curr_step=STEP)`` (``dcp.save`` of the flattened state into ``checkpoint/step-2``) and
``load`` a fresh manager's ``load()``: it finds the latest ``step-N`` folder holding a ``.metadata``,
``dcp.load``s into the flattened state and calls the model wrapper's ``load_state_dict``. Covered: the
manager's flattening, step folders, step discovery and load policy over FSDP2 / tp / replicated layouts
resharded at 2 ranks; not covered: torchtitan's ``OptimizersContainer`` (its own flattening of optimizer
state; the contract's optimizer is torch's Adam), async saves and Hugging Face formats.

    distcheck certify distcheck.libs.targets.torchtitan:CHECKPOINT_MANAGER --contract checkpoint

``LLAMA`` (training-step contract, on gloo worlds of 2 and 4): torchtitan's own Llama 3 (the debug model's
architecture) under torchtitan's own ``parallelize_llama`` and, under pp, torchtitan's own pipeline split
(``pipeline_llm``, the target's ``pipeline`` hook), with the substitutions that let it run on CPU in float64, in
:mod:`distcheck.libs.targets.torchtitan_llama`.

``MOE`` (moe-layer contract with ``dropless=true``, on gloo worlds of 2 and 4): torchtitan's router and
``AllToAllTokenDispatcher`` (counts exchanged, then ``all_to_all_single`` of the actual split sizes), the adapter
and its conventions in :mod:`distcheck.libs.targets.torchtitan_moe`; there too the row of its MoE debug model
under its own parallelize (training-step): a skip, the model's backward refused on CPU under every attention
backend.
"""

from __future__ import annotations

from typing import Any

from distcheck.core.results import CheckResult
from distcheck.core.vocab import Axis
from distcheck.libs.targets import WorldRun
from distcheck.libs.targets.torchtitan_llama import LLAMA, titan_clip_grad_norm  # noqa: F401 - WORLD_CERTIFY's torchtitan:LLAMA
from distcheck.libs.targets.torchtitan_llama import PRELOAD as _LLAMA_PRELOAD
from distcheck.libs.targets.torchtitan_moe import MOE, TORCHTITAN_OPTIONS, moe_step_row  # noqa: F401 - WORLD_CERTIFY's torchtitan:MOE
from distcheck.parallel.layout.contracts import LayoutTarget, Probe, ProbeSet
from distcheck.parallel.step.hooks import StepTarget
from distcheck.parallel.step.plans import fsdp2_tp

__all__ = ["DIST", "TITLE", "CERTIFY", "WORLD_CERTIFY", "PARALLEL_DIMS", "BAD_INPUT", "CLIP_GRAD_NORM",
           "CHECKPOINT_MANAGER",
           "TorchtitanCheckpointManager", "extra_rows"]

DIST = "torchtitan"
TITLE = "torchtitan ParallelDims"
#: the largest world drawn (every rank builds its meshes once per configuration)
MAX_WORLD = 16
#: ParallelDims' degrees (its keyword names)
DEGREES = (Axis.DP_REPLICATE.value, Axis.DP_SHARD.value, Axis.CP.value, Axis.TP.value, Axis.PP.value)


def _world(c: dict[str, int]) -> int:
    return c[Axis.DP_REPLICATE] * c[Axis.DP_SHARD] * c[Axis.CP] * c[Axis.TP] * c[Axis.PP]


def _with_ep(c: dict[str, int]) -> Any:
    from hypothesis import strategies as st

    host = c[Axis.DP_SHARD] * c[Axis.CP] * c[Axis.TP]
    eps = [d for d in range(1, host + 1) if host % d == 0]
    return st.tuples(st.sampled_from(eps), st.booleans()).map(
        lambda t: dict(c, ep=t[0], dp_shard=-1 if t[1] else c[Axis.DP_SHARD], world_size=_world(c)))


def _configs() -> Any:
    from hypothesis import strategies as st

    base = st.fixed_dictionaries({k: st.integers(1, 4 if k == Axis.DP_SHARD else 2) for k in DEGREES})
    return base.filter(lambda c: _world(c) <= MAX_WORLD).flatmap(_with_ep)


def _rank_groups(ctx: Any, cfg: dict[str, int]) -> dict[str, list[int]]:
    import logging

    from torchtitan.distributed.parallel_dims import ParallelDims

    logging.getLogger("torchtitan").setLevel(logging.ERROR)
    kw = {k: v for k, v in cfg.items() if k != "world_size"}
    dims = ParallelDims(**kw, world_size=ctx.world_size)
    dims.build_mesh()
    return {name: [int(r) for r in mesh.mesh.flatten().tolist()] for name, mesh in dims._single_axis_meshes.items()}


def _groups(cfg: dict[str, int]) -> dict[str, list[list[int]]]:
    from distcheck.engine.fake import run_fake

    world = cfg["world_size"]
    seen: dict[str, set[tuple[int, ...]]] = {}
    for rank in range(world):
        for name, group in run_fake(_rank_groups, cfg, world_size=world, rank=rank).items():
            seen.setdefault(name, set()).add(tuple(sorted(group)))
    return {name: [list(g) for g in groups] for name, groups in seen.items()}


def _order(cfg: dict[str, int]) -> str:
    from distcheck.parallel.layout import TORCHTITAN_DENSE_ORDER

    return f"{TORCHTITAN_DENSE_ORDER} (ep borrowed from tp-cp-dp_shard)"


def _reference(cfg: dict[str, int]) -> dict[str, list[list[int]]]:
    from distcheck.parallel.layout import ParallelConfig, TorchtitanLayout, derive_degree, groups, torchtitan_layout

    kw = {k: v for k, v in cfg.items() if k != "world_size"}
    mine = torchtitan_layout(**kw, world_size=cfg["world_size"])
    out = {name: mine.groups(name) for name in (*TorchtitanLayout.SPANS, *TorchtitanLayout.EXPERT)}
    shard = kw[Axis.DP_SHARD] if kw[Axis.DP_SHARD] != -1 else derive_degree(
        cfg["world_size"], **{k: kw[k] for k in DEGREES if k != Axis.DP_SHARD})
    # distcheck's one-dp layout: dp = dp_replicate * dp_shard under the same order
    whole = ParallelConfig(tp=kw[Axis.TP], cp=kw[Axis.CP], pp=kw[Axis.PP], dp=kw[Axis.DP_REPLICATE] * shard,
                           order=(Axis.TP, Axis.CP, Axis.DP, Axis.PP))
    out.update({a: groups(whole, a) for a in (Axis.TP, Axis.CP, Axis.PP, Axis.DP)})
    out["batch"] = groups(whole, Axis.DP)
    return out


PARALLEL_DIMS = LayoutTarget("torchtitan.parallel_dims", DIST, _configs, _groups, _reference, _order)

_PD = "ParallelDims(dp_replicate={}, dp_shard={}, cp=1, tp={}, pp=1, ep={}, world_size={})"
_PD_IMPORT = "from torchtitan.distributed.parallel_dims import ParallelDims"
BAD_INPUT = ProbeSet("torchtitan.parallel_dims", DIST, _PD_IMPORT, (
    Probe("dp_replicate=0", _PD.format(0, 2, 1, 1, 2) + ".dp_replicate"),
    Probe("tp=-2", _PD.format(1, -1, -2, 1, 4) + ".dp_shard"),
    Probe("dp_shard=3 in a world of 4", _PD.format(1, 3, 1, 1, 4) + ".dp_shard"),
    Probe("dp_shard=-1 with tp=3 in a world of 4", _PD.format(1, -1, 3, 1, 4) + ".dp_shard"),
    Probe("dp_shard=-2", _PD.format(1, -2, 1, 1, 4) + ".dp_shard"),
    Probe("ep=3 not dividing dp_shard*cp*tp=2", _PD.format(1, 2, 1, 3, 2) + ".ep"),
), valid=(
    Probe("dp_shard=2 in a world of 2", _PD.format(1, 2, 1, 1, 2) + ".dp_shard"),
))



#: torch's composition stepped with torchtitan's clip_grad_norm_ (training-step contract)
CLIP_GRAD_NORM = StepTarget(fsdp2_tp, clip_grad_norm=titan_clip_grad_norm)

#: the targets of this module and the contract each is certified under
CERTIFY = (("PARALLEL_DIMS", "rank-layout"), ("BAD_INPUT", "bad-input"))
#: the targets certified on gloo worlds of 2 ranks: clip_grad_norm_ without a pp mesh (FSDP2 shards; tp shards with
#: tp-replicated norms) and with one (two pipeline stages); the checkpoint manager, saving under one layout and
#: loading under another (6 examples per dtype: each is a save and a load of every rank); the dropless MoE's
#: dispatcher at 2 and 4 ranks, float32
_STEP_PRELOAD = ("torch.distributed.fsdp", "torch.distributed.tensor.parallel", "torch.distributed.pipelining",
                 "torchtitan.distributed.utils")
WORLD_CERTIFY = (
    WorldRun("CLIP_GRAD_NORM", "training-step", "torchtitan.clip_grad_norm_fsdp", world_sizes=(2,),
             max_examples=3, options={"layout": "dp_shard=2"}, preload=_STEP_PRELOAD),
    WorldRun("CLIP_GRAD_NORM", "training-step", "torchtitan.clip_grad_norm_tp", world_sizes=(2,),
             max_examples=3, options={"layout": "tp=2"}, preload=_STEP_PRELOAD),
    WorldRun("CLIP_GRAD_NORM", "training-step", "torchtitan.clip_grad_norm_pp", world_sizes=(2,), max_examples=3,
             options={"layout": "pp=2"}, preload=_STEP_PRELOAD),
    WorldRun("CHECKPOINT_MANAGER", "checkpoint", "torchtitan.checkpoint_manager", world_sizes=(2,), max_examples=6,
             preload=("torch.distributed.checkpoint", "torchtitan.components.checkpoint")),
    WorldRun("MOE", "moe-layer", "torchtitan.moe", world_sizes=(2, 4), max_examples=5, options=TORCHTITAN_OPTIONS,
             dtypes=("float32",), timeout_s=120.0,
             preload=("torchtitan.models.common.moe", "torchtitan.models.common.token_dispatcher")),
    # torchtitan's Llama 3 under its own parallelize_llama (torchtitan_llama's module doc): one example per layout,
    # each a build, parallelize and 2 or 3 steps of every rank, about 40 s at 2 ranks and 2 minutes at 4 on 2 cores
    WorldRun("LLAMA", "training-step", "torchtitan.llama_fsdp", world_sizes=(2,), max_examples=1,
             options={"layout": "dp_shard=2"}, preload=_LLAMA_PRELOAD),
    WorldRun("LLAMA", "training-step", "torchtitan.llama_tp", world_sizes=(2,), max_examples=1,
             options={"layout": "tp=2"}, preload=_LLAMA_PRELOAD),
    WorldRun("LLAMA", "training-step", "torchtitan.llama_fsdp_tp", world_sizes=(4,), max_examples=1,
             options={"layout": "dp_shard=2,tp=2"}, preload=_LLAMA_PRELOAD),
    # and through torchtitan's own pipeline split (pipeline_llm, the target's pipeline hook): GPipe and 1F1B drawn
    WorldRun("LLAMA", "training-step", "torchtitan.llama_pp", world_sizes=(2,), max_examples=3,
             options={"layout": "pp=2"}, preload=_LLAMA_PRELOAD),
    WorldRun("LLAMA", "training-step", "torchtitan.llama_pp_tp", world_sizes=(4,), max_examples=1,
             options={"layout": "pp=2,tp=2"}, preload=_LLAMA_PRELOAD),
    WorldRun("LLAMA", "training-step", "torchtitan.llama_pp_fsdp", world_sizes=(4,), max_examples=1,
             options={"layout": "dp_shard=2,pp=2"}, preload=_LLAMA_PRELOAD),
)


def extra_rows(*, required: bool = False) -> list[CheckResult]:
    """``libs.torchtitan.parallel_dims.ep_placement``: the expert-parallel placement torchtitan follows, named
    (:func:`distcheck.libs.targets.ep_placement_row`), from ``ParallelDims`` of a 4-rank world with
    dp_shard = tp = ep = 2 built on the fake backend; ``libs.torchtitan.moe_step``: its MoE debug model under its own
    parallelize, a skip with the reasons probed on CPU (:func:`~distcheck.libs.targets.torchtitan_moe.moe_step_row`)
    (``required`` is unused: the library is installed here)."""
    from distcheck.libs.targets import ep_placement_row, library

    cfg = {Axis.DP_REPLICATE.value: 1, Axis.DP_SHARD.value: 2, Axis.CP.value: 1, Axis.TP.value: 2, Axis.PP.value: 1,
           Axis.EP.value: 2, "world_size": 4}
    call = "ParallelDims(dp_replicate=1, dp_shard=2, cp=1, tp=2, pp=1, ep=2, world_size=4).build_mesh()['ep']"
    return [ep_placement_row("libs.torchtitan.parallel_dims.ep_placement", library(DIST), _groups(cfg)[Axis.EP.value],
                             tp=2, data=2, ep=2, call=call), moe_step_row()]


class _ModelPart:
    """The model part handed to torchtitan's ``ModelWrapper``: ``state_dict()`` is the contract's model state
    (its tensors, so that ``dcp.load`` fills them in place) and ``load_state_dict(sd, strict=False)``, which
    the manager calls after ``dcp.load``, copies the model keys of the flattened dict back into it."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    def state_dict(self) -> dict[str, Any]:
        return self.state

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True) -> None:
        for k in self.state:
            if k in state_dict:
                self.state[k] = state_dict[k]


class _OptimizerState:
    """The ``optimizers`` Stateful handed to the manager: torch's FQN-keyed optimizer state dict of the contract
    (``get_state_dict``'s ``optim``), loaded in place by ``dcp.load`` and written back by ``load_state_dict``."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    def state_dict(self) -> dict[str, Any]:
        return self.state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.state.update(state_dict)


class TorchtitanCheckpointManager:
    """torchtitan's ``CheckpointManager`` as a target of the ``checkpoint`` contract (section "checkpoint
    manager" of the module doc). ``save(state, path)`` and ``load(state, path)`` take the contract's state
    ``{"model": ..., "optim": ...}`` and a folder every rank names alike; :data:`STEP` is the step saved."""

    name = "torchtitan.checkpoint_manager"
    distribution = DIST
    #: the manager's ``checkpoint.exclude_from_loading`` (none: every state is restored)
    exclude_from_loading: tuple[str, ...] = ()

    @classmethod
    def _manager(cls, state: dict[str, Any], path: str) -> Any:
        import logging

        from torch.nn import Module
        from torchtitan.components.checkpoint import CheckpointManager

        logging.getLogger("torchtitan").setLevel(logging.ERROR)
        part = _ModelPart(state["model"])
        # ModelWrapper accepts an nn.Module or a list of them; it calls only state_dict / load_state_dict
        part_module: Module = part  # type: ignore[assignment]
        config = CheckpointManager.Config(enable=True, folder=FOLDER, interval=1, keep_latest_k=0,
                                          async_mode="disabled", last_save_model_only=False,
                                          initial_load_model_only=False,
                                          exclude_from_loading=list(cls.exclude_from_loading))
        return CheckpointManager(config, dataloader=None, model_parts=[part_module],
                                 optimizers=_OptimizerState(state["optim"]), lr_schedulers=None,
                                 states={}, sd_adapter=None, base_folder=path)

    @classmethod
    def save(cls, state: dict[str, Any], path: str) -> None:
        """``CheckpointManager(...).save(curr_step=STEP)``: ``dcp.save`` of the flattened state into
        ``<path>/checkpoint/step-<STEP>``. RuntimeError when the manager reports that it saved nothing."""
        manager = cls._manager(state, path)
        try:
            if not manager.save(curr_step=STEP):
                raise RuntimeError(f"torchtitan CheckpointManager.save(curr_step={STEP}) saved nothing")
        finally:
            manager.close()

    @classmethod
    def load(cls, state: dict[str, Any], path: str) -> None:
        """``CheckpointManager(...).load()`` (the latest step found under ``<path>/checkpoint``): ``dcp.load``
        into the flattened state, then the model part's ``load_state_dict``. RuntimeError when the manager
        reports that it found no checkpoint."""
        manager = cls._manager(state, path)
        try:
            if not manager.load():
                raise RuntimeError(f"torchtitan CheckpointManager.load() found no checkpoint under {path}/{FOLDER}")
        finally:
            manager.close()


#: the manager's ``checkpoint.folder``, under the contract's folder
FOLDER = "checkpoint"
#: the step saved (not 0: a step-0 checkpoint is loaded model-only, by design of the manager)
STEP = 2
#: the target ``distcheck.libs.targets.torchtitan:CHECKPOINT_MANAGER``
CHECKPOINT_MANAGER = TorchtitanCheckpointManager
