"""The model a plan sizes: a preset of :data:`distcheck.parallel.params.PRESETS`, an explicit shape, or a raw count.

A :class:`ModelSpec` carries the parameter count P and, when known, the
:class:`~distcheck.parallel.params.TransformerConfig` it came from. The shape is what
activation memory, tensor-parallel divisibility and communication need; a raw
count (the lesson's 13B-style exercise gives only ``13e9`` parameters) sizes the
training state alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from distcheck.core.errors import ConfigError
from distcheck.core.validate import check_int, check_printable
from distcheck.parallel import params as params_ref

__all__ = ["ModelSpec", "resolve_model", "preset_names", "SHAPE_FIELDS"]

#: the TransformerConfig fields the command line takes for an explicit shape
SHAPE_FIELDS = ("hidden_size", "num_layers", "ffn_hidden_size", "num_heads", "num_kv_heads", "vocab_size")


@dataclass(frozen=True)
class ModelSpec:
    """What a plan knows about the model.

    Attributes:
        name: the preset name, ``"custom"`` for an explicit shape, or ``"<P> params"``.
        params: the parameter count P (int >= 1), counted tensor by tensor
            (:func:`distcheck.parallel.params.count_params`) when ``config`` is known.
        config: the shape, or None when only P was given.
    """

    name: str
    params: int
    config: params_ref.TransformerConfig | None = None

    @property
    def has_shape(self) -> bool:
        return self.config is not None


def preset_names() -> list[str]:
    """The names of :data:`distcheck.parallel.params.PRESETS`, sorted."""
    return sorted(params_ref.PRESETS)


def _squash(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


def _preset(name: str) -> tuple[str, params_ref.TransformerConfig]:
    check_printable("model", name)  # "llama-3-8b\n" must not pass for llama-3-8b once squashed
    if name in params_ref.PRESETS:
        return name, params_ref.PRESETS[name]
    # "llama3-70b" and "Llama-3-70B" name the preset "llama-3-70b": compare without punctuation or case
    matches = [k for k in params_ref.PRESETS if _squash(k) == _squash(name)]
    if len(matches) == 1:
        return matches[0], params_ref.PRESETS[matches[0]]
    from distcheck.parallel.ep import models as moe_models

    raise ConfigError("model", name, f"is not a preset (dense: {', '.join(preset_names())}; MoE: "
                                     f"{', '.join(sorted(moe_models.MODELS))}; case and punctuation are ignored: "
                                     "llama3-70b names llama-3-70b)")


#: the largest parameter count a plan takes: 1e18, a million times the largest models trained (a larger count
#: is a typo, and its figures would print hundreds of digits)
MAX_PARAMS = 10**18


def _parse_count(value: object) -> int:
    """A parameter count: an int, or a decimal string such as ``"13e9"`` that is a whole number, from 1 to
    :data:`MAX_PARAMS`."""
    if isinstance(value, str):
        try:
            q = Fraction(value.replace("_", "").replace(",", ""))
        except (ValueError, ZeroDivisionError):
            raise ConfigError("params", value,
                              "must be a whole number of parameters, like 13e9 or 13000000000") from None
        if q.denominator != 1:
            raise ConfigError("params", value, "must be a whole number of parameters")
        value = int(q)
    return check_int("params", value, min_value=1, max_value=MAX_PARAMS)


def resolve_model(model: str | None = None, *, params: int | str | None = None, **shape: int | None) -> ModelSpec:
    """The :class:`ModelSpec` for a preset name, an explicit shape or a raw parameter count.

    Exactly one of the three must be given:

    * ``model``: a key of :data:`distcheck.parallel.params.PRESETS`; case and punctuation
      are ignored, so ``"llama3-70b"`` names ``"llama-3-70b"``;
    * the shape: every field of :data:`SHAPE_FIELDS` (``num_kv_heads`` optional,
      default ``num_heads``), a SwiGLU decoder with RMS norms
      (:class:`distcheck.parallel.params.TransformerConfig`'s defaults);
    * ``params``: a parameter count (int, or a string like ``"13e9"``); no shape,
      so no activations.

    Raises:
        ConfigError: none or several of the three, an unknown preset, a missing
        shape field, or a shape the TransformerConfig refuses (naming the field).
    """
    given = {k: v for k, v in shape.items() if v is not None}
    unknown = sorted(set(given) - set(SHAPE_FIELDS))
    if unknown:
        raise ConfigError(unknown[0], given[unknown[0]], f"is not a shape field ({', '.join(SHAPE_FIELDS)})")
    sources = [n for n, present in (("model", model is not None), ("params", params is not None),
                                    ("shape", bool(given))) if present]
    if not sources:
        raise ConfigError("model", None, "is required: give a preset (--model), a shape (--hidden-size, --num-layers, "
                                         "...) or a parameter count (--params)")
    if len(sources) > 1:
        field = sources[0]
        value = {"model": model, "params": params}.get(field)
        raise ConfigError(field, value,
                          f"cannot be combined with {' or '.join(sources[1:])}: give one way to name the model")
    if model is not None:
        name, cfg = _preset(model)
        return ModelSpec(name, params_ref.count_params(cfg), cfg)
    if params is not None:
        count = _parse_count(params)
        return ModelSpec(f"{count:,} params", count, None)
    missing = [f for f in SHAPE_FIELDS if f != "num_kv_heads" and f not in given]
    if missing:
        raise ConfigError(missing[0], None, "is required with an explicit shape (or give --model or --params)")
    cfg = params_ref.TransformerConfig(
        hidden_size=given["hidden_size"], num_layers=given["num_layers"], ffn_hidden_size=given["ffn_hidden_size"],
        num_heads=given["num_heads"], num_kv_heads=given.get("num_kv_heads"), vocab_size=given["vocab_size"])
    return ModelSpec("custom", params_ref.count_params(cfg), cfg)
