"""Hypothesis strategies of transformer shapes: valid TransformerConfigs (GQA, SwiGLU, tied
embeddings, norms and biases drawn).

Public path: :mod:`distcheck.strategies` (Hypothesis' conventions are listed there).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from distcheck.core.validate import check_at_least, check_interval, check_optional_bool
from distcheck.engine.strategies import defines

if TYPE_CHECKING:
    from distcheck.parallel.params.reference import TransformerConfig

__all__ = ["transformer_configs"]


def _v_transformer_configs(*, min_layers: int, max_layers: int, max_kv_heads: int, max_group: int,
                           max_head_dim: int, min_ffn: int, max_ffn: int, min_vocab: int, max_vocab: int,
                           gqa: bool | None, swiglu: bool | None, tied: bool | None) -> None:
    check_interval("min_layers", min_layers, "max_layers", max_layers)
    check_at_least("max_kv_heads", max_kv_heads, 1)
    check_at_least("max_group", max_group, 1)
    check_at_least("max_head_dim", max_head_dim, 1)
    check_interval("min_ffn", min_ffn, "max_ffn", max_ffn)
    check_interval("min_vocab", min_vocab, "max_vocab", max_vocab)
    for name, value in (("gqa", gqa), ("swiglu", swiglu), ("tied", tied)):
        check_optional_bool(name, value)
    if gqa and max_group < 2:
        raise InvalidArgument("gqa=True needs max_group >= 2 (num_heads = group * num_kv_heads), "
                              f"got max_group={max_group}")


@defines(_v_transformer_configs)
def transformer_configs(
    draw: st.DrawFn,
    *,
    min_layers: int = 1, max_layers: int = 4,
    max_kv_heads: int = 4, max_group: int = 4, max_head_dim: int = 16,
    min_ffn: int = 1, max_ffn: int = 256,
    min_vocab: int = 1, max_vocab: int = 512,
    gqa: bool | None = None,
    swiglu: bool | None = None,
    tied: bool | None = None,
) -> TransformerConfig:
    """A valid :class:`distcheck.parallel.params.TransformerConfig`.

    num_heads = num_kv_heads * group, with num_kv_heads in 1..max_kv_heads and group
    in 1..max_group; head_dim in 1..max_head_dim; hidden_size = num_heads * head_dim
    or (half the time) an explicit head_dim with any hidden size.

    - ``gqa``: True: num_kv_heads < num_heads; False: equal (MHA); None: either.
    - ``swiglu``, ``tied``: force the option on/off, or None (default) to draw it.
    Norm kind and biases are drawn.
    """
    from distcheck.parallel.params.reference import NORMS, TransformerConfig

    kv = draw(st.integers(1, max_kv_heads))
    if gqa is None:
        group = draw(st.integers(1, max_group))
    elif gqa:
        group = draw(st.integers(2, max_group))
    else:
        group = 1
    heads = kv * group
    head_dim = draw(st.integers(1, max_head_dim))
    explicit = draw(st.booleans())
    hidden = draw(st.integers(1, heads * max_head_dim)) if explicit else heads * head_dim
    return TransformerConfig(
        hidden_size=hidden,
        num_layers=draw(st.integers(min_layers, max_layers)),
        ffn_hidden_size=draw(st.integers(min_ffn, max_ffn)),
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim if explicit else None,
        vocab_size=draw(st.integers(min_vocab, max_vocab)),
        swiglu=draw(st.booleans()) if swiglu is None else swiglu,
        tied_embeddings=draw(st.booleans()) if tied is None else tied,
        norm=draw(st.sampled_from(NORMS)),
        final_norm=draw(st.booleans()),
        qkv_bias=draw(st.booleans()),
        mlp_bias=draw(st.booleans()),
        out_bias=draw(st.booleans()),
    )
