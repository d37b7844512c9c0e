"""Activation memory of one transformer layer, summed tensor by tensor.

The reference derivation of Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models" (arXiv:2205.05198), section 4.1:
list every tensor a layer keeps for its backward pass, with its element count,
its bytes per element (2 for 16-bit activations, 1 for a dropout mask), whether
tensor parallelism splits it, and whether selective recomputation drops it;
then add them up. The closed forms of the paper's Table 2
(``activations.bytes_per_layer.*`` in :mod:`distcheck.parallel.activations.forms`) are
checked against these sums.

Shapes: s = sequence length, b = micro-batch size, h = hidden size,
a = attention heads, t = tensor-parallel size, f = MLP width (default 4h, the
GPT layer of the paper; a plain two-matrix GeLU MLP).

What tensor parallelism splits (section 4.2.1): everything inside the attention
and MLP blocks, but not the layer-norm inputs, the inputs of the first linear
of each block, or the two dropout masks after the blocks (10 sbh bytes).
Sequence parallelism (section 4.2.2) splits those along the sequence, so every
tensor is divided by t. Selective recomputation (section 5) recomputes the
softmax, its dropout and the dropout output (the 5 a s^2 b term) instead of
storing them. Full recomputation stores only the layer input.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from distcheck.core.errors import ConfigError
from distcheck.core.validate import check_choice, check_positive_int

__all__ = [
    "StoredTensor",
    "LAYER_TENSORS",
    "RECOMPUTE",
    "TABLE2_SETTINGS",
    "stored_tensor_bytes",
    "bytes_per_layer",
    "table2_bytes_per_layer",
    "megatron_bytes_per_layer",
]

#: the recomputation settings: none, selective (attention only) or full (Korthikanti et al. 2022, §5)
RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class StoredTensor:
    """One tensor a layer keeps for the backward pass.

    Attributes:
        name: what it is (e.g. ``"softmax_output"``).
        block: ``"attention"``, ``"mlp"`` or ``"layernorm"``.
        width: ``"h"`` (s*b*h elements), ``"ffn"`` (s*b*f) or ``"scores"`` (a*s*s*b).
        bytes_per_element: 2 (16-bit activation) or 1 (dropout mask).
        tp_split: tensor parallelism divides it by t.
        dropped_by_selective: selective recomputation recomputes it instead of storing it.
    """

    name: str
    block: str
    width: str
    bytes_per_element: int
    tp_split: bool
    dropped_by_selective: bool = False


#: Korthikanti et al. 2022, section 4.1, in the order the paper walks the layer.
LAYER_TENSORS: tuple[StoredTensor, ...] = (
    # attention block: 11 sbh + 5 a s^2 b
    StoredTensor("qkv_input", "attention", "h", 2, tp_split=False),
    StoredTensor("q", "attention", "h", 2, tp_split=True),  # Q and K for QK^T
    StoredTensor("k", "attention", "h", 2, tp_split=True),
    StoredTensor("softmax_output", "attention", "scores", 2, tp_split=True, dropped_by_selective=True),
    StoredTensor("softmax_dropout_mask", "attention", "scores", 1, tp_split=True, dropped_by_selective=True),
    StoredTensor("softmax_dropout_output", "attention", "scores", 2, tp_split=True, dropped_by_selective=True),
    StoredTensor("v", "attention", "h", 2, tp_split=True),
    StoredTensor("out_proj_input", "attention", "h", 2, tp_split=True),
    StoredTensor("attention_dropout_mask", "attention", "h", 1, tp_split=False),
    # MLP block: 19 sbh with f = 4h
    StoredTensor("fc1_input", "mlp", "h", 2, tp_split=False),
    StoredTensor("gelu_input", "mlp", "ffn", 2, tp_split=True),
    StoredTensor("fc2_input", "mlp", "ffn", 2, tp_split=True),
    StoredTensor("mlp_dropout_mask", "mlp", "h", 1, tp_split=False),
    # two layer norms: 4 sbh
    StoredTensor("layernorm1_input", "layernorm", "h", 2, tp_split=False),
    StoredTensor("layernorm2_input", "layernorm", "h", 2, tp_split=False),
)

#: Table 2 rows -> (uses t, sequence_parallel, recompute)
TABLE2_SETTINGS: dict[str, tuple[bool, bool, str]] = {
    "none": (False, False, "none"),
    "tp": (True, False, "none"),
    "tp_sp": (True, True, "none"),
    "tp_selective": (True, False, "selective"),
    "tp_sp_selective": (True, True, "selective"),
    "full_recompute": (False, False, "full"),
}


def _exact(q: Fraction) -> int | Fraction:
    return int(q) if q.denominator == 1 else q


def _check(s: int, b: int, h: int, a: int, t: int, ffn: int | None) -> int:
    for name, v in (("s", s), ("b", b), ("h", h), ("a", a), ("t", t)):
        check_positive_int(name, v)
    if ffn is None:
        return 4 * h
    return check_positive_int("ffn", ffn)


def stored_tensor_bytes(
    s: int, b: int, h: int, a: int, t: int = 1, *,
    sequence_parallel: bool = False, recompute: str = "none", ffn: int | None = None,
) -> list[tuple[str, int | Fraction]]:
    """Bytes of each tensor one layer stores on one GPU, as ``(name, bytes)``.

    Args:
        s, b, h, a, t: sequence length, micro-batch size, hidden size, heads,
            tensor-parallel size (ints >= 1).
        sequence_parallel: also split the non-TP tensors along the sequence.
        recompute: ``"none"``, ``"selective"`` (drop the attention-score
            tensors) or ``"full"`` (store only the layer input, 2 s b h bytes,
            divided by t under sequence parallelism).
        ffn: MLP width f (default 4h).

    Returns:
        Exact bytes per tensor (int, or Fraction when t does not divide).

    Raises:
        ConfigError: a size that is not an int >= 1, or an unknown recompute.
    """
    f = _check(s, b, h, a, t, ffn)
    check_choice("recompute", recompute, RECOMPUTE)
    if not isinstance(sequence_parallel, bool):
        raise ConfigError("sequence_parallel", sequence_parallel, "must be a bool")
    if recompute == "full":
        layer_input = Fraction(2 * s * b * h, t if sequence_parallel else 1)
        return [("layer_input", _exact(layer_input))]
    elements = {"h": s * b * h, "ffn": s * b * f, "scores": a * s * s * b}
    out = []
    for x in LAYER_TENSORS:
        if recompute == "selective" and x.dropped_by_selective:
            continue
        split = t if (x.tp_split or sequence_parallel) else 1
        out.append((x.name, _exact(Fraction(x.bytes_per_element * elements[x.width], split))))
    return out


def bytes_per_layer(
    s: int, b: int, h: int, a: int, t: int = 1, *,
    sequence_parallel: bool = False, recompute: str = "none", ffn: int | None = None,
) -> int | Fraction:
    """Activation bytes one layer stores on one GPU: the sum of :func:`stored_tensor_bytes`.

    Same arguments and errors as :func:`stored_tensor_bytes`.
    """
    total = sum((Fraction(v) for _, v in stored_tensor_bytes(
        s, b, h, a, t, sequence_parallel=sequence_parallel, recompute=recompute, ffn=ffn)), Fraction(0))
    return _exact(total)


def table2_bytes_per_layer(setting: str, s: int, b: int, h: int, a: int, t: int = 1) -> int | Fraction:
    """The reference value of one row of Korthikanti et al. 2022 Table 2.

    ``setting`` is a key of :data:`TABLE2_SETTINGS` (``"none"``, ``"tp"``,
    ``"tp_sp"``, ``"tp_selective"``, ``"tp_sp_selective"``, ``"full_recompute"``);
    rows without tensor parallelism ignore ``t``. f = 4h.

    Returns exact bytes (int or Fraction). Raises ConfigError for an unknown
    ``setting`` or a size that is not an integer >= 1.
    """
    check_choice("setting", setting, tuple(TABLE2_SETTINGS))
    uses_t, sp, recompute = TABLE2_SETTINGS[setting]
    t = check_positive_int("t", t)
    return bytes_per_layer(s, b, h, a, t if uses_t else 1, sequence_parallel=sp, recompute=recompute)


def megatron_bytes_per_layer(s: int, b: int, h: int, ffn: int, t: int = 1) -> int | Fraction:
    """Per-layer bytes with sequence parallelism and selective recompute, for any MLP width.

    This is the quantity Megatron-LM's ``theoretical_memory_usage.py`` writes as
    ``s b h (18 + 4 f / h) / t``; it equals Table 2's ``34 s b h / t`` at f = 4h.
    The reference is the tensor sum with a two-matrix MLP of width ``ffn``
    (a SwiGLU MLP stores more). ``a`` does not matter once the scores are recomputed.
    """
    return bytes_per_layer(s, b, h, 1, t, sequence_parallel=True, recompute="selective", ffn=ffn)
