"""Uneven all-gathers on gloo: a correct implementation pads every shard to ceil(L/tp), and the
collectives properties accept exactly the padded volume of the closed form
``comm.size_bytes.all_gather_padded``, named as such; any other volume still fails."""

from __future__ import annotations

import pytest

from distcheck.core.vocab import Collective
from distcheck.engine.catalogue import get
from distcheck.engine.contracts.checks import PADDED_NOTE, compare_collectives, padded_all_gather

AG = Collective.ALL_GATHER


def test_the_padded_volume_is_the_closed_form_and_only_for_uneven_lengths():
    assert get("comm.size_bytes.all_gather_padded").evaluate(length=5, n=2, slice_bytes=8) == 48
    assert padded_all_gather(5, 2, 8) == ((AG, 40), (AG, 48))  # shards of 3 and 2 rows, both padded to 3
    assert padded_all_gather(7, 4, 2) == ((AG, 14), (AG, 16))
    assert padded_all_gather(6, 3, 8) is None  # tp divides: nothing to pad, only the exact size


@pytest.mark.parametrize("got, ok", [(40, True), (48, True), (56, False), (32, False), (44, False)])
def test_exactly_the_exact_or_the_padded_volume_passes(got, ok):
    pair = padded_all_gather(5, 2, 8)
    assert pair is not None
    outcome = compare_collectives("forward", [(AG, 40)], [[(AG, got)], [(AG, got)]], "one all-gather", [pair])
    assert outcome.ok is ok
    if ok:
        assert outcome.note == (PADDED_NOTE if got == 48 else "")
    else:
        assert outcome.ranks == (0, 1)
        assert outcome.message == (
            f"forward collectives differ from all_gather x1 (S=40 B) (one all-gather; or all_gather at its padded "
            f"volume S=48 B (each shard padded to ceil(L/n) slices, closed form comm.size_bytes.all_gather_padded) "
            f"for the all_gather of S=40 B): rank 0: all_gather x1 (S={got} B); rank 1: all_gather x1 (S={got} B)")


def test_without_a_padded_pair_the_padded_volume_fails():
    assert not compare_collectives("forward", [(AG, 48)], [[(AG, 64)]], "one all-gather").ok


# ---------------------------------------------------------------- on a world: a layer that pads, one that over-pads

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402


def _blocks(n: int, tp: int) -> list[tuple[int, int]]:
    sizes = [n // tp + (r < n % tp) for r in range(tp)]
    starts = [sum(sizes[:r]) for r in range(tp)]
    return [(s, s + k) for s, k in zip(starts, sizes, strict=True)]


class _PaddedGather(torch.autograd.Function):
    """All-gather the last dim with every shard zero-padded to ceil(n/tp) + extra (equal shards, as gloo needs)."""

    @staticmethod
    def forward(ctx, y, width, extra):
        rank, tp = dist.get_rank(), dist.get_world_size()
        blocks = _blocks(width, tp)
        ctx.block = blocks[rank]
        longest = -(-width // tp) + extra
        pad = torch.zeros(*y.shape[:-1], longest, dtype=y.dtype)
        pad[..., :y.shape[-1]] = y
        out = torch.empty(tp, *pad.shape, dtype=y.dtype)
        dist.all_gather_into_tensor(out, pad.contiguous())
        return torch.cat([out[r][..., :hi - lo] for r, (lo, hi) in enumerate(blocks)], dim=-1)

    @staticmethod
    def backward(ctx, grad):
        lo, hi = ctx.block
        return grad[..., lo:hi].contiguous(), None, None


class _Copy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad)
        return grad


class PaddedColumnParallel(nn.Module):
    """Column-parallel linear for any width: numpy.array_split rows, the output gathered padded to ceil(n/tp)."""

    extra = 0

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        lo, hi = _blocks(out_features, dist.get_world_size())[dist.get_rank()]
        self.out_features = out_features
        self.weight = nn.Parameter(torch.zeros(hi - lo, in_features))
        self.bias = nn.Parameter(torch.zeros(hi - lo)) if bias else None

    def forward(self, x):
        y = nn.functional.linear(_Copy.apply(x), self.weight, self.bias)
        return _PaddedGather.apply(y, self.out_features, self.extra)


class OverPaddedColumnParallel(PaddedColumnParallel):
    """The same with one slice of padding too many: gathers more than the closed form's padded volume."""

    extra = 1


@pytest.mark.multiprocess
@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
def test_a_padding_layer_is_certified_and_an_over_padding_one_is_not(threaded2):
    from distcheck.certify.engine import certify

    opts = {"divisible": False}
    good = certify(PaddedColumnParallel, "column-parallel-linear", pool=threaded2, examples=20, seed=3,
                   options=opts, dtypes=("float64",))
    by = {v.property: v for v in good.verdicts}
    assert good.ok, [(v.property, v.failure) for v in good.verdicts if v.verdict != "pass"]
    assert by["collectives.forward"].note == PADDED_NOTE
    bad = certify(OverPaddedColumnParallel, "column-parallel-linear", pool=threaded2, examples=20, seed=3,
                  options=opts, dtypes=("float64",))
    v = {v.property: v for v in bad.verdicts}["collectives.forward"]
    assert v.verdict == "FAIL" and v.failure.startswith("forward collectives differ from all_gather x1")
