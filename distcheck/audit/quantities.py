"""The auditable quantities: the closed-form catalogue plus a few documented composites.

Every closed form of :func:`distcheck.closed_form.catalogue` is an auditable
quantity under the same name, with the same inputs and unit. On top of them
this module adds:

* composites built from closed forms (e.g. training state plus activations,
  ZeRO bytes per GPU plus activations, activations of a whole model, the ZeRO
  communication ratio of stage 3 to DDP), each with its source;
* small exact arithmetic the sources print and that no closed form covers (the
  tokens in a global batch, the layers of a trimmed pipeline stage, the lesson's
  2x4 tensor-parallel worked example, computed with exact fractions);
* two *not-checkable* quantities, ``empirical.max_abs_error`` (an error measured
  on a random draw the source does not publish) and ``reported.fact`` (a
  reported number, e.g. a training run's GPU count, that no formula derives):
  a claim naming them always gets the verdict ``not-checkable``.

Model presets. A quantity with a ``params`` input, or with architecture inputs
(``hidden_size``, ``num_layers``, ``h``, ``a``, ...), also accepts
``model = "<preset>"`` naming an entry of :data:`distcheck.parallel.params.PRESETS`; the
preset fills every architecture input the quantity has, and ``params`` is the
exact total of ``params.decoder_only`` for that preset (e.g. ``llama-3-70b`` is
70,553,706,496). An input given explicitly wins over the preset. The *nominal*
count in the name (70e9 for ``llama-3-70b``) is a convention the audit tries
(:mod:`distcheck.audit.conventions`).

Units. A claim's unit must belong to the family of the quantity's unit:
bytes (bytes, B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), dimensionless
(fraction, ratio, x, %), counts (count, params, GPUs, ticks, tokens, ...; with
an optional decimal scale ``K``/``M``/``B``/``T`` or binary ``Ki``/``Mi``/``Gi``
prefix and a space, e.g. ``"M tokens"``, ``"B params"``), ``bytes_per_param``
(also ``B/param``) and ``flag`` (0/1, false/true). A declared bridge
(:data:`distcheck.audit.claim_units.UNIT_BRIDGES`) lets a figure in bytes measure a
quantity in elements, through the claim's ``bytes_per_element``.

Convention inputs. Some quantities take inputs their own formula does not read, only
their documented conventions and unit bridges (:attr:`Quantity.convention_inputs`,
declared in :data:`CONVENTION_INPUTS`): the ZeRO paper's element counts
``zero.comm_elements_per_rank.*`` (2 Psi, 3 Psi: no world size) also take ``n`` and
``bytes_per_element``, so a figure with the ring factor 2(n-1)/n Psi (or that in bytes)
is read under the ring-factor convention.
"""

from __future__ import annotations

import fnmatch
from dataclasses import replace
from fractions import Fraction

from distcheck.audit.claim_units import (  # noqa: F401 - read as qmod.<name> by the key readers and verdicts
    KNOWN_UNITS_HELP,
    bridge_between,
    bridged_factor,
    is_known_unit,
    unit_factor,
    unit_family,
)
from distcheck.audit.constraints import TRIM_ENDS_DIVISIBLE
from distcheck.audit.presets import _DECODER_INPUTS, _PRESET_FIELDS, nominal_params, preset_names  # noqa: F401
from distcheck.audit.quantity import InputValues, Quantity, QuantityInput, _ev, _form_inputs, _from_form, _pick
from distcheck.audit.worked_examples import (
    column_shard,
    matrix_of,
    row_partial,
    sliced_activation_matches,
    swapped_mlp_matches,
    vecmat,
    vector_of,
)
from distcheck.closed_form import catalogue
from distcheck.core.errors import ConfigError, UnknownQuantityError
from distcheck.core.validate import check_type
from distcheck.core.vocab import Axis, Collective

__all__ = [
    "quantities",
    "get_quantity",
    "renamed",
    "RENAMED_PREFIXES",
    "list_quantities",
    "preset_inputs",
]

# ----------------------------------------------------------------------------- quantities


def _int_check(name: str, value: int | Fraction) -> int:
    if Fraction(value).denominator != 1:
        raise ConfigError(name, value, "must be an integer")
    return int(value)


def _trim_ends(values: InputValues) -> int:
    L, p, k = (_int_check(n, values[n]) for n in ("num_layers", "p", "trimmed"))
    if (L + 2 * k) % p:
        raise ConfigError("num_layers", L, f"plus 2*trimmed={2 * k} must be a multiple of p={p}")
    return (L + 2 * k) // p


#: the two seed documents, cited by their public titles
_LESSON = "lesson 'Scaling and distributed training' (adapted in part from AI Engineering from Scratch)"
_CHAPTER = "'Chapter 26: Distributed Training' of Language Modelling: The Complete Guide"


def _composites() -> list[Quantity]:
    Q, Inp = Quantity, QuantityInput
    act_bytes = Inp("activation_bytes", "activation bytes per GPU, added once (replicated: each GPU holds its own)",
                    "bytes", "nonnegative", 0)
    out: list[Quantity] = []
    out.append(Q(
        "memory.state_plus_activations_bytes", "bytes",
        f"{_LESSON} section 3, 7B-style step 2 (107.81 GB + 0.822 GB = 108.63 GB); {_CHAPTER} memory table totals",
        "training state b P / (t p) (memory.train_state_bytes) plus activation_bytes",
        _form_inputs("memory.train_state_bytes") + (act_bytes,),
        lambda v: _ev("memory.train_state_bytes", **_pick(v, ("params", "bytes_per_param", "tp", "pp")))
        + v.get("activation_bytes", 0),
    ))
    for s in range(4):
        out.append(Q(
            f"memory.per_gpu_bytes.zero{s}", "bytes",
            f"ZeRO paper (Rajbhandari et al. 2020) Figure 1 plus activations; {_CHAPTER} ZeRO table",
            f"zero.bytes_per_gpu.stage{s} plus activation_bytes (activations are not sharded by ZeRO-DP)",
            _form_inputs(f"zero.bytes_per_gpu.stage{s}") + (act_bytes,),
            lambda v, s=s: _ev(f"zero.bytes_per_gpu.stage{s}", **_pick(v, ("params", "dp", "k")))
            + v.get("activation_bytes", 0),
        ))
    out.append(Q(
        "memory.fits", "flag", f"{_LESSON} section 3 ('fits 80 GB', 'does not fit an 80 GB GPU')",
        "1 if total_bytes <= gpu_bytes else 0",
        (Inp("total_bytes", "bytes to hold", "bytes", "positive"),
         Inp("gpu_bytes", "memory of one GPU", "bytes", "positive")),
        lambda v: 1 if v["total_bytes"] <= v["gpu_bytes"] else 0,
    ))
    for row in ("none", "tp", "tp_sp", "tp_selective", "tp_sp_selective", "full_recompute"):
        name = f"activations.bytes_per_layer.{row}"
        out.append(Q(
            f"activations.total_bytes.{row}", "bytes", catalogue()[name].source + " times num_layers",
            f"{name} times num_layers (every layer stores the same)",
            _form_inputs(name) + (Inp("num_layers", "transformer layers L", "layers"),),
            lambda v, name=name: _ev(name, **_pick(v, ("s", "b", "h", "a", "t"))) * v["num_layers"],
        ))
    out.append(Q(
        "activations.checkpointed_peak_bytes", "bytes",
        "Korthikanti et al. 2022 Table 2: full recompute keeps 2sbh per layer; the layer being recomputed holds "
        f"34sbh (the selective row at t=1: attention scores not stored, as with flash attention); {_LESSON} "
        "section 3, 0.822 GB",
        "num_layers x 2 s b h (checkpointed layer inputs) + 34 s b h / t "
        "(one layer's activations during its recompute)",
        _form_inputs("activations.bytes_per_layer.tp_sp_selective", drop=("a",))
        + (Inp("num_layers", "transformer layers L", "layers"),),
        lambda v: _ev("activations.bytes_per_layer.full_recompute", **_pick(v, ("s", "b", "h"))) * v["num_layers"]
        + _ev("activations.bytes_per_layer.tp_sp_selective", **_pick(v, ("s", "b", "h", "t"))),
    ))
    for op in (Collective.ALL_REDUCE, Collective.ALL_GATHER, Collective.REDUCE_SCATTER, Collective.ALL_TO_ALL):
        factor = 2 if op == Collective.ALL_REDUCE else 1  # an all-reduce is a reduce-scatter plus an all-gather
        out.append(Q(
            f"comm.bytes_per_rank_no_ring_factor.{op}", "bytes",
            "ZeRO paper (Rajbhandari et al. 2020) section 7 counts Psi per collective, dropping (n-1)/n; "
            "the n -> infinity limit of nccl-tests' factors",
            f"{factor} x S: comm.bytes_per_rank.{op} with the ring factor (n-1)/n dropped",
            _form_inputs(f"comm.bytes_per_rank.{op}"),
            lambda v, factor=factor: factor * v["size_bytes"],
        ))
    for st in ("stage1", "stage2", "stage3"):
        out.append(Q(
            f"zero.comm_ratio.{st}", "ratio", "ZeRO paper (Rajbhandari et al. 2020) section 7 (stage 3: 1.5x DDP)",
            f"zero.comm_elements_per_rank.{st} / zero.comm_elements_per_rank.ddp",
            _form_inputs("zero.comm_elements_per_rank.ddp"),
            lambda v, st=st: Fraction(_ev(f"zero.comm_elements_per_rank.{st}", **v))
            / _ev("zero.comm_elements_per_rank.ddp", **v),
        ))
    out.append(Q(
        "layout.world_size.ep_inside_dp", "GPUs",
        "torchtitan ParallelDims (ep borrowed from the data-parallel ranks); layout.world_size",
        "GPUs when expert parallelism is carved out of dp*cp: tp*cp*pp*dp (ep must divide dp*cp)",
        _form_inputs("layout.world_size.ep_outside_dp"),
        lambda v: _ep_inside(v),
    ))
    out.append(Q(
        "layout.tokens_per_batch", "tokens",
        "Llama 3 (Dubey et al. 2024) Table 4: tokens/batch = DP x batch/DP x seq len",
        "tokens in one global batch: dp x sequences per dp replica x seq_len",
        (Inp("dp", "data-parallel degree", "GPUs"),
         Inp("batch_per_dp", "sequences per data-parallel replica", "sequences"),
         Inp("seq_len", "tokens per sequence", "tokens")),
        lambda v: v["dp"] * v["batch_per_dp"] * v["seq_len"],
    ))
    out.append(Q(
        "layout.global_batch", "sequences", f"{_LESSON} section 5, 'Global batch size'; DeepSpeed train_batch_size",
        "sequences per optimizer step: dp x micro_batch_size x grad_accum",
        (Inp("dp", "data-parallel degree", "GPUs"),
         Inp("micro_batch_size", "sequences per GPU per micro-step", "sequences"),
         Inp("grad_accum", "gradient-accumulation steps", "count", default=1)),
        lambda v: v["dp"] * v["micro_batch_size"] * v["grad_accum"],
    ))
    out.append(Q(
        "layout.batch_fraction_per_gpu", "fraction", f"{_LESSON} section 3, '3D parallelism' (sees 1/d of each batch)",
        "fraction of each global batch one GPU sees: 1/dp (tp and pp ranks of a replica see the same data)",
        (Inp("dp", "data-parallel degree", "GPUs"),),
        lambda v: Fraction(1) / v["dp"],
    ))
    out.append(Q(
        "layout.nodes_per_replica", "nodes", f"{_CHAPTER} 3D example (TP within a node, PP across nodes)",
        "nodes one model replica spans: tp x pp / gpus_per_node",
        (Inp("tp", "tensor-parallel degree", "GPUs"), Inp("pp", "pipeline-parallel degree", "GPUs"),
         Inp("gpus_per_node", "GPUs per node", "GPUs", default=8)),
        lambda v: Fraction(v["tp"] * v["pp"]) / v["gpus_per_node"],
    ))
    out.append(Q(
        "pp.layers_per_stage.even", "layers", "even split of layers over pipeline stages",
        "layers per stage when num_layers is split evenly over p stages: num_layers / p "
        "(not an integer when p does not divide it)",
        (Inp("num_layers", "transformer layers", "layers"), Inp("p", "pipeline stages", "stages")),
        lambda v: Fraction(v["num_layers"]) / v["p"],
    ))
    out.append(Q(
        "pp.layers_per_stage.trim_ends", "layers",
        "Llama 3 (Dubey et al. 2024) section 3.3.2: one layer removed from the first and the last stage",
        "layers of each middle stage when the first and last stages hold `trimmed` fewer: (num_layers + 2 trimmed) / p",
        (Inp("num_layers", "transformer layers", "layers"), Inp("p", "pipeline stages", "stages"),
         Inp("trimmed", "layers removed from each end stage", "layers", "nonnegative_integer", 1)),
        _trim_ends, constraints=("p divides num_layers + 2 trimmed",), requires=(TRIM_ENDS_DIVISIBLE,),
    ))
    out.append(Q(
        "pp.total_layers.trim_ends", "layers",
        "Llama 3 (Dubey et al. 2024) section 3.3.2: one layer removed from the first and the last stage",
        "layers of a pipeline of p stages whose middle stages hold layers_per_stage and whose two end stages hold "
        "`trimmed` fewer: p x layers_per_stage - 2 trimmed",
        (Inp("p", "pipeline stages", "stages"), Inp("layers_per_stage", "layers of a middle stage", "layers"),
         Inp("trimmed", "layers removed from each end stage", "layers", "nonnegative_integer", 1)),
        lambda v: v["p"] * v["layers_per_stage"] - 2 * v["trimmed"],
    ))
    psrc = f"{_LESSON} section 3, 70B-style worked example; composed from the params.* closed forms"
    layer_inputs = tuple(dict.fromkeys(
        _form_inputs("params.attention_per_layer") + _form_inputs("params.mlp_per_layer")
        + tuple(i for i in _form_inputs("params.norms") if i.name in ("norm_weights", "norm_biases"))))
    out.append(Q(
        "params.linear", "params", psrc,
        "weights of one linear layer: in_features x out_features (+ out_features bias)",
        (Inp("in_features", "input width", "elements"), Inp("out_features", "output width", "elements"),
         Inp("bias", "1: the layer has a bias", "", "flag", 0)),
        lambda v: v["in_features"] * v["out_features"] + v.get("bias", 0) * v["out_features"],
    ))

    def _layer(v: InputValues) -> int | Fraction:
        att = _ev("params.attention_per_layer", **_pick(v, ("hidden_size", "num_heads", "num_kv_heads", "head_dim",
                                                              "qkv_bias", "out_bias")))
        mlp = _ev("params.mlp_per_layer", **_pick(v, ("hidden_size", "ffn_hidden_size", "swiglu", "mlp_bias")))
        # the layer's two norms: params.norms for one layer without the final norm
        norms = _ev("params.norms", hidden_size=v["hidden_size"], num_layers=1, final_norm=0,
                    **_pick(v, ("norm_weights", "norm_biases")))
        return att + mlp + norms

    out.append(Q(
        "params.layer", "params", psrc,
        "parameters of one transformer layer: params.attention_per_layer + params.mlp_per_layer + its two norms",
        layer_inputs, _layer,
    ))
    out.append(Q(
        "params.layers", "params", psrc, "parameters of all transformer layers: num_layers x params.layer",
        layer_inputs + (Inp("num_layers", "transformer layers L", "count"),),
        lambda v: _layer(v) * v["num_layers"],
    ))
    out.append(Q(
        "params.embedding_and_head", "params", psrc, "params.embedding + params.lm_head (V d, twice when untied)",
        _form_inputs("params.lm_head"),
        lambda v: _ev("params.embedding", **_pick(v, ("vocab_size", "hidden_size")))
        + _ev("params.lm_head", **_pick(v, ("vocab_size", "hidden_size", "tied"))),
    ))
    out.append(Q(
        "activations.reduction_factor", "ratio",
        "Korthikanti et al. 2022 (arXiv:2205.05198) abstract ('reduce activation memory by 5x') and Table 2",
        "activations.bytes_per_layer.tp / activations.bytes_per_layer.tp_sp_selective: what sequence parallelism plus "
        "selective recompute saves over tensor parallelism alone",
        _form_inputs("activations.bytes_per_layer.tp"),
        lambda v: Fraction(_ev("activations.bytes_per_layer.tp", **v))
        / _ev("activations.bytes_per_layer.tp_sp_selective", **v),
    ))
    out.append(Q(
        "dp.shard_size.max", "examples", f"numpy.array_split ({_LESSON} data_parallel_grad)",
        "largest shard when n examples are split over dp ranks: dp.shard_size of rank 0 (ceil(n / dp))",
        (Inp("n", "examples", "examples"), Inp("dp", "data-parallel ranks", "GPUs")),
        lambda v: _ev("dp.shard_size", n=v["n"], dp=v["dp"], rank=0),
    ))
    out.append(Q(
        "dp.shard_size.min", "examples", f"numpy.array_split ({_LESSON} data_parallel_grad)",
        "smallest shard when n examples are split over dp ranks: dp.shard_size of the last rank (floor(n / dp))",
        (Inp("n", "examples", "examples"), Inp("dp", "data-parallel ranks", "GPUs")),
        lambda v: _ev("dp.shard_size", n=v["n"], dp=v["dp"], rank=v["dp"] - 1),
    ))
    vec = Inp("x", "input row vector (a list of numbers)", "", "vector")
    mat = Inp("w", "weight matrix (a list of rows)", "", "matrix")
    tp_in = Inp("tp", "tensor-parallel ranks", "GPUs")
    shard_in = Inp("shard", "0-based rank whose piece is computed", "", "nonnegative_integer")
    src = f"{_LESSON} section 3, 'Tensor parallelism: columns and rows' worked example (exact arithmetic)"
    out.append(Q("tp.example.full_output", "value", src, "x W computed exactly", (vec, mat),
                 lambda v: vecmat(vector_of(v, "x"), matrix_of(v, "w")), array=True))
    out.append(Q("tp.example.column_shard_output", "value", src,
                 "x W_k for the k-th column shard of W (numpy.array_split over columns)", (vec, mat, tp_in, shard_in),
                 column_shard, array=True))
    out.append(Q("tp.example.row_shard_partial", "value", src,
                 "x_k W_k for the k-th row shard of W and the matching slice of x (summed by an all-reduce)",
                 (vec, mat, tp_in, shard_in), row_partial, array=True))
    out.append(Q(
        "tp.example.swapped_mlp_matches", "flag",
        f"{_LESSON} section 2 exercise 4 (swap the split order); a counterexample settles 'not exact'",
        "1 if relu(x W1) W2 equals the swapped split (row-split W1, column-split W2, no all-reduce) on this input",
        (vec, Inp("w1", "first weight matrix", "", "matrix"), Inp("w2", "second weight matrix", "", "matrix"), tp_in),
        swapped_mlp_matches,
    ))
    out.append(Q(
        "tp.example.sliced_activation_matches", "flag",
        f"{_LESSON} section 4, 'Predict: why can ReLU be applied to each slice separately, but a layer "
        "norm over the hidden dimension could not?' (exact arithmetic; a counterexample settles 'could not')",
        "1 if the activation applied to each column shard of h (numpy.array_split) equals the activation of the "
        "whole h on this input: ReLU (layer_norm = 0) or layer norm over the hidden dimension without affine "
        "weights (layer_norm = 1)",
        (Inp("h", "hidden activation before the nonlinearity, x W_up (a list of numbers)", "", "vector"), tp_in,
         Inp("layer_norm", "1: layer norm over the hidden dimension; 0: ReLU", "", "flag", 0),
         Inp("eps", "layer-norm epsilon added to the variance", "", "nonnegative", 0)),
        sliced_activation_matches,
    ))
    out.append(Q(
        "empirical.max_abs_error", "any",
        "a floating-point error measured by running code on random data",
        "an error measured on a random draw; it depends on the draw (seed, data) and the BLAS summation order",
        (), None,
        reason="the figure is a measurement on a random draw the source does not publish; no closed form gives it",
    ))
    out.append(Q(
        "reported.fact", "any", "a reported fact (a model card, a paper's training setup)",
        "a number a source reports (a parameter count, a GPU count of a run) that no formula derives",
        (), None,
        reason="a reported fact: the inputs that would derive it are not published",
    ))
    return out


def _ep_inside(v: InputValues) -> int | Fraction:
    """layout.world_size (ep adds no GPUs) once ep is checked to divide dp*cp."""
    if Fraction(v["dp"] * v.get("cp", 1)) % v["ep"]:
        raise ConfigError("ep", v["ep"], f"must divide dp*cp={v['dp'] * v.get('cp', 1)} when ep is inside dp")
    return _ev("layout.world_size", **_pick(v, ("tp", "pp", "dp", "cp")))




#: (quantity name pattern, inputs only its conventions and unit bridges read): see Quantity.convention_inputs
CONVENTION_INPUTS: tuple[tuple[str, tuple[QuantityInput, ...]], ...] = (
    ("zero.comm_elements_per_rank.*", (
        QuantityInput("n", "data-parallel ranks N_d (read only by the ring-factor convention (n-1)/n)", "GPUs"),
        QuantityInput("bytes_per_element", "bytes of one communicated element, 2 for bf16 (read only for a "
                      "figure printed in bytes and by the ring-factor convention)", "bytes", default=2),
    )),
)

_QUANTITIES: dict[str, Quantity] | None = None


def quantities() -> dict[str, Quantity]:
    """Every auditable quantity by name (closed forms first, then the composites)."""
    global _QUANTITIES
    if _QUANTITIES is None:
        table = {name: _from_form(form) for name, form in catalogue().items()}
        from distcheck.audit.composites import composites

        for q in _composites() + composites():
            if q.name in table:
                raise ValueError(f"audit quantity {q.name!r} shadows a closed form")
            table[q.name] = q
        for pattern, extra in CONVENTION_INPUTS:
            for name in fnmatch.filter(list(table), pattern):
                table[name] = replace(table[name], convention_inputs=table[name].convention_inputs + extra)
        _QUANTITIES = dict(sorted(table.items()))
    return _QUANTITIES


#: old name -> new name, by prefix: quantities renamed to the one name of their parallelism
#: (:class:`distcheck.core.vocab.Axis`: pipeline parallelism is ``pp``). An answer key naming an old name still
#: loads, for one release; the report says which name it read (:attr:`distcheck.audit.keys.Claim.alias`).
RENAMED_PREFIXES: dict[str, str] = {"pipeline.": f"{Axis.PP}."}


def renamed(name: str) -> str | None:
    """The current name of ``name`` when ``name`` is the old name of a quantity (``pipeline.bubble_fraction.gpipe``
    -> ``pp.bubble_fraction.gpipe``), else None."""
    for old, new in RENAMED_PREFIXES.items():
        if name.startswith(old) and new + name[len(old):] in quantities():
            return new + name[len(old):]
    return None


def get_quantity(name: str) -> Quantity:
    """The quantity called ``name``; raises ConfigError when ``name`` is not a str and
    UnknownQuantityError (a KeyError, with close matches) when no quantity has that name."""
    check_type("name", name, str, "must be a str naming a quantity (see list_quantities())")
    table = quantities()
    if name not in table:
        raise UnknownQuantityError(name, list(table))
    return table[name]


def list_quantities() -> list[dict]:
    """Name, inputs (name, unit, kind, default, description), unit, source and description of every quantity."""
    return [q.as_dict() for q in quantities().values()]


def preset_inputs(model: str, quantity: Quantity) -> dict[str, Fraction]:
    """The inputs of ``quantity`` a preset fills (exact). ``params`` is the total of
    ``params.decoder_only`` for the preset. Raises ConfigError for an unknown preset or a
    ``quantity`` that is not a Quantity."""
    from distcheck.parallel.params import PRESETS

    check_type("model", model, str, "must be a preset name (a str)")
    check_type("quantity", quantity, Quantity, "must be a Quantity (see get_quantity)")
    if model not in PRESETS:
        raise ConfigError("model", model, f"must be one of {', '.join(sorted(PRESETS))}")
    cfg = PRESETS[model]
    out: dict[str, Fraction] = {}
    for name in quantity.input_names:
        if name in _PRESET_FIELDS:
            out[name] = Fraction(_PRESET_FIELDS[name](cfg))
        elif name == "params":
            out[name] = Fraction(_ev("params.decoder_only", **{k: _PRESET_FIELDS[k](cfg) for k in _DECODER_INPUTS}))
    return out
