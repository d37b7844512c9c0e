"""Training-state memory per GPU: bytes per parameter, TP/PP splits, GPU counts.

Everything here is exact: integers and :class:`fractions.Fraction`, never
floats. Results are in bytes; convert with :func:`distcheck.core.units.bytes_to`
or print with :func:`distcheck.core.units.format_bytes` (GB = 1e9 bytes, GiB =
2**30 bytes: ``format_bytes(107_810_390_016, "GB")`` is ``'107.81 GB'`` and
with ``"GiB"`` ``'100.41 GiB'``). Byte arguments (``budget_bytes``,
``total_bytes``, ``gpu_bytes``) take an exact number of bytes or a string that
names its unit, ``"80 GB"`` (80e9 bytes) or ``"80 GiB"`` (85,899,345,920 bytes).

The training state (activations excluded) is ``bytes_per_param * params``.
Without sharding, tensor parallelism (tp) and pipeline parallelism (pp) split
the weights ``tp * pp`` ways, so each GPU holds ``b * P / (tp * pp)`` bytes
(the lesson "Scaling and distributed training", section 3 "Memory per GPU"); data parallelism does not
reduce it at all. The formula assumes every tensor splits evenly, which real
layers only approximate (norms and embeddings are often replicated).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from fractions import Fraction

from distcheck.core.errors import ConfigError
from distcheck.core.units import parse_bytes
from distcheck.core.validate import check_positive_int

__all__ = [
    "BytesPerParam",
    "CONVENTIONS",
    "bytes_per_param",
    "train_state_bytes",
    "weights_bytes",
    "grads_bytes",
    "optimizer_bytes",
    "min_tp",
    "min_tp_pp",
    "min_gpus",
    "MAX_NUM_LAYERS",
]


@dataclass(frozen=True)
class BytesPerParam:
    """Bytes of training state per parameter, by component.

    Attributes:
        weights: the working copy of the weights (2 for bf16/fp16).
        grads: the gradients (2 for bf16, 4 for fp32).
        master: the fp32 master copy of the weights (4, or 0 without one).
        momentum: first moment (Adam m, or SGD momentum).
        variance: second moment (Adam v; 0 for SGD).
        source: where the convention comes from.

    Raises ConfigError when a byte count is not an integer >= 0.
    """

    weights: int
    grads: int
    master: int
    momentum: int
    variance: int
    source: str = ""

    def __post_init__(self) -> None:
        for name in ("weights", "grads", "master", "momentum", "variance"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(name, value, "must be an integer >= 0")

    @property
    def optimizer(self) -> int:
        """Optimizer state per parameter: master + moments (the ZeRO paper's K)."""
        return self.master + self.momentum + self.variance

    @property
    def total(self) -> int:
        """weights + grads + master + momentum + variance."""
        return self.weights + self.grads + self.optimizer


#: Named conventions. ``mixed_adamw`` (16) is the lesson's and the ZeRO paper's
#: (Rajbhandari et al. 2020, section 3.1: 2 + 2 + K with K = 12);
#: ``mixed_adamw_fp32_grads`` (18) keeps fp32 gradients, as Megatron-LM counts;
#: ``adam_8bit`` stores Adam's moments in 8 bits (bitsandbytes; the per-block
#: fp32 scales, about 4 bytes per 2048 values, are ignored): 2 + 2 + 4 + 1 + 1 = 10,
#: the answer to the lesson's 8-bit Adam question (section 4);
#: ``sgd_momentum`` is mixed-precision SGD with momentum: 2 + 2 + 4 master + 4 = 12;
#: ``moments_only`` has no fp32 master (2 + 2 + 4 + 4 = 12): the chapter's
#: convention ("Chapter 26: Distributed Training": "Adam optimizer states" = 8 bytes per parameter) and
#: the lesson's "common mistake" of using 12 for mixed-precision Adam.
CONVENTIONS: dict[str, BytesPerParam] = {
    "mixed_adamw": BytesPerParam(2, 2, 4, 4, 4, "lesson section 1; ZeRO paper section 3.1 (K = 12)"),
    "mixed_adamw_fp32_grads": BytesPerParam(2, 4, 4, 4, 4, "Megatron-LM theoretical memory (fp32 grads)"),
    "adam_8bit": BytesPerParam(2, 2, 4, 1, 1, "bitsandbytes 8-bit Adam; lesson section 4 exercise"),
    "sgd_momentum": BytesPerParam(2, 2, 4, 4, 0, "mixed-precision SGD with momentum"),
    "moments_only": BytesPerParam(2, 2, 0, 4, 4,
                                  "chapter 'Chapter 26: Distributed Training' table; lesson 'common mistakes'"),
}

BytesLike = int | Fraction | str | BytesPerParam


def bytes_per_param(convention: str) -> BytesPerParam:
    """The :class:`BytesPerParam` of a named convention (a key of :data:`CONVENTIONS`).

    Raises:
        ConfigError: unknown convention.
    """
    try:
        return CONVENTIONS[convention]
    except (KeyError, TypeError):
        raise ConfigError("convention", convention, f"must be one of {', '.join(CONVENTIONS)}") from None


def _exact(q: Fraction) -> int | Fraction:
    return int(q) if q.denominator == 1 else q


def _positive_number(field: str, value: object) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, (int, Fraction)):
        raise ConfigError(field, value, "must be an int or Fraction (exact arithmetic; no floats)")
    if value <= 0:
        raise ConfigError(field, value, "must be > 0")
    return Fraction(value)


def _positive_bytes(field: str, value: object) -> Fraction:
    """A byte count: an int/Fraction of bytes, or a string with its unit ('80 GB', '80 GiB')."""
    if isinstance(value, str):
        try:
            value = parse_bytes(value)
        except ConfigError as exc:
            raise ConfigError(field, value, exc.rule) from None
    if isinstance(value, bool) or not isinstance(value, (int, Fraction)):
        raise ConfigError(field, value, "must be an int or Fraction number of bytes (exact; no floats), "
                                        "or a string like '80 GB' / '80 GiB'")
    if value <= 0:
        raise ConfigError(field, value, "must be > 0")
    return Fraction(value)


def _resolve(b: BytesLike) -> BytesPerParam | Fraction:
    if isinstance(b, BytesPerParam):
        return b
    if isinstance(b, str):
        return bytes_per_param(b)
    return _positive_number("bytes_per_param", b)


def _split(params: object, tp: object, pp: object) -> tuple[int, int, int]:
    params = check_positive_int("params", params)
    tp = check_positive_int("tp", tp)
    pp = check_positive_int("pp", pp)
    return params, tp, pp


def train_state_bytes(params: int, bytes_per_param: BytesLike = 16, tp: int = 1, pp: int = 1) -> int | Fraction:
    """Training state (weights, grads, optimizer; no activations) per GPU, in bytes.

    ``bytes_per_param * params / (tp * pp)`` (the lesson "Scaling and distributed training", section 3).

    Args:
        params: parameter count P (int >= 1).
        bytes_per_param: an int or Fraction, a convention name, or a BytesPerParam.
        tp, pp: tensor- and pipeline-parallel sizes (ints >= 1).

    Returns:
        Exact bytes: an int, or a Fraction when ``tp * pp`` does not divide.

    Raises:
        ConfigError: non-positive or non-integer params/tp/pp, unknown convention,
        float or non-positive bytes_per_param.
    """
    params, tp, pp = _split(params, tp, pp)
    b = _resolve(bytes_per_param)
    per = Fraction(b.total) if isinstance(b, BytesPerParam) else b
    return _exact(per * params / (tp * pp))


def _component(params: int, convention: str | BytesPerParam, tp: int, pp: int, attr: str) -> int | Fraction:
    params, tp, pp = _split(params, tp, pp)
    b = convention if isinstance(convention, BytesPerParam) else bytes_per_param(convention)
    return _exact(Fraction(getattr(b, attr)) * params / (tp * pp))


def weights_bytes(params: int, convention: str | BytesPerParam = "mixed_adamw", tp: int = 1,
                  pp: int = 1) -> int | Fraction:
    """Bytes of the working weights per GPU: ``weights * params / (tp * pp)`` (exact)."""
    return _component(params, convention, tp, pp, "weights")


def grads_bytes(params: int, convention: str | BytesPerParam = "mixed_adamw", tp: int = 1,
                pp: int = 1) -> int | Fraction:
    """Bytes of the gradients per GPU: ``grads * params / (tp * pp)`` (exact)."""
    return _component(params, convention, tp, pp, "grads")


def optimizer_bytes(params: int, convention: str | BytesPerParam = "mixed_adamw", tp: int = 1,
                    pp: int = 1) -> int | Fraction:
    """Bytes of optimizer state (fp32 master + moments) per GPU: ``K * params / (tp * pp)`` (exact)."""
    return _component(params, convention, tp, pp, "optimizer")


def min_tp(params: int, budget_bytes: int | Fraction | str, bytes_per_param: BytesLike = 16,
           max_tp: int = 8) -> int | None:
    """Smallest power-of-two tp <= ``max_tp`` whose training state fits ``budget_bytes``.

    Fits means ``train_state_bytes(params, bytes_per_param, tp) <= budget_bytes``
    (activations not counted; lesson section 6 exercise: 13e9 params, 80 GB -> 4).
    Closed form (no ``max_tp`` cap): ``memory.min_tp_pow2``.

    Args:
        params: parameter count P (int >= 1).
        budget_bytes: per-GPU budget in bytes (int or Fraction), or a string
            naming its unit: ``"80 GB"`` (80e9 bytes) or ``"80 GiB"`` (80 * 2**30).
        bytes_per_param: as :func:`train_state_bytes` (default 16).
        max_tp: largest tp tried (int >= 1, default 8: one server).

    Returns:
        The tp (1, 2, 4, ...), or **None** when no power of two up to
        ``max_tp`` fits. Not fitting is an answer, not a bad input, so it is
        not raised.

    Raises:
        ConfigError: invalid params, budget_bytes, bytes_per_param or max_tp.
    """
    budget = _positive_bytes("budget_bytes", budget_bytes)
    max_tp = check_positive_int("max_tp", max_tp)
    tp = 1
    while tp <= max_tp:
        if train_state_bytes(params, bytes_per_param, tp=tp) <= budget:
            return tp
        tp *= 2
    return None


def min_tp_pp(
    params: int,
    budget_bytes: int | Fraction | str,
    bytes_per_param: BytesLike = 16,
    max_tp: int = 8,
    max_pp: int = 64,
    num_layers: int | None = None,
    pp_pow2: bool = False,
) -> tuple[int, int] | None:
    """Smallest ``tp * pp`` split whose training state per GPU fits ``budget_bytes``.

    Candidates: tp a power of two <= ``max_tp``; pp in 1..``max_pp``, restricted
    to divisors of ``num_layers`` when given (each stage gets whole layers) and
    to powers of two when ``pp_pow2``.

    Tie-break: among splits with the smallest product, the one with the
    **largest tp** (tensor parallelism stays inside a server and fewer stages
    mean a smaller pipeline bubble; lesson section 5).

    Example (lesson section 2 exercise 3): the 70B-style model (68,975,329,280
    params) at 80 GB with ``num_layers=80`` gives (8, 2): 68.98 GB per GPU.
    Without the layer constraint, pp = 7 is allowed and (2, 7) wins (78.83 GB).
    Closed form of the product without the layer constraint:
    ``memory.min_tp_pp_product`` = ``ceil(b P / budget)`` (14 here).

    Args:
        params, bytes_per_param: as :func:`train_state_bytes`.
        budget_bytes: bytes (int or Fraction) or ``"80 GB"`` / ``"80 GiB"``.
        max_tp: largest power-of-two tp tried (default 8); max_pp: largest pp (default 64).
        num_layers: when given, pp must divide it. pp_pow2: pp a power of two.

    Returns:
        ``(tp, pp)`` or **None** when nothing fits.

    Work: O(log max_tp) splits, each O(log max_pp) (pp_pow2) or at most
    O(sqrt(num_layers)) divisor trials: huge ``max_pp`` never loops over every pp.

    Raises:
        ConfigError: invalid arguments; ``num_layers > MAX_NUM_LAYERS`` (10**12).
    """
    budget = _positive_bytes("budget_bytes", budget_bytes)
    max_tp = check_positive_int("max_tp", max_tp)
    max_pp = check_positive_int("max_pp", max_pp)
    if num_layers is not None:
        num_layers = check_positive_int("num_layers", num_layers)
        if num_layers > MAX_NUM_LAYERS:
            raise ConfigError("num_layers", num_layers, f"must be <= {MAX_NUM_LAYERS} (bounds the divisor search)")
    if not isinstance(pp_pow2, bool):
        raise ConfigError("pp_pow2", pp_pow2, "must be a bool")
    full = Fraction(train_state_bytes(params, bytes_per_param))  # validates params and bytes_per_param
    divisors = _divisors_up_to(num_layers, max_pp) if num_layers is not None else None
    best: tuple[int, int] | None = None
    tp = 1
    while tp <= max_tp:
        # bytes fall as pp grows, so the smallest fitting pp is the first allowed pp >= full / (tp * budget)
        pp = _first_allowed_pp(_ceil_fraction(full / (tp * budget)), max_pp, divisors, pp_pow2)
        if pp is not None:
            key = (tp * pp, -tp)
            if best is None or key < (best[0] * best[1], -best[0]):
                best = (tp, pp)
        tp *= 2
    return best


def _ceil_fraction(q: Fraction) -> int:
    return -((-q.numerator) // q.denominator)


def _divisors_up_to(n: int, limit: int) -> list[int]:
    """The divisors of ``n`` that are <= ``limit``, ascending: O(min(limit, sqrt n)) trials
    (divisors come in pairs d, n // d with d <= sqrt n; past ``limit`` both exceed it)."""
    out: set[int] = set()
    d = 1
    while d * d <= n and d <= limit:
        if n % d == 0:
            out.update(x for x in (d, n // d) if x <= limit)
        d += 1
    return sorted(out)


def _first_allowed_pp(low: int, max_pp: int, divisors: list[int] | None, pp_pow2: bool) -> int | None:
    """The smallest pp with ``max(low, 1) <= pp <= max_pp`` that is in ``divisors`` (when given)
    and a power of two (when ``pp_pow2``); None if there is none."""
    low = max(low, 1)
    if low > max_pp:
        return None
    if divisors is not None:
        i = bisect.bisect_left(divisors, low)
        return next((d for d in divisors[i:] if not pp_pow2 or d & (d - 1) == 0), None)
    if pp_pow2:
        pp = 1 << (low - 1).bit_length()  # the smallest power of two >= low
        return pp if pp <= max_pp else None
    return low


#: the largest num_layers :func:`min_tp_pp` searches the divisors of (about sqrt of it trials)
MAX_NUM_LAYERS = 10**12


def min_gpus(total_bytes: int | Fraction | str, gpu_bytes: int | Fraction | str) -> int:
    """Fewest GPUs of ``gpu_bytes`` each that hold ``total_bytes``: ``ceil(total / gpu)``.

    A lower bound: it assumes the state splits perfectly ("Chapter 26: Distributed
    Training": "H100 80GB GPUs needed: minimum 11" for ~870 GB). Both arguments are
    bytes (int or Fraction) or strings naming their unit (``"870 GB"``,
    ``"80 GiB"``). Closed form: ``memory.min_gpus``.

    Raises:
        ConfigError: non-positive or float arguments, or a string that is not
        a number followed by a byte unit.
    """
    total = _positive_bytes("total_bytes", total_bytes)
    gpu = _positive_bytes("gpu_bytes", gpu_bytes)
    q = total / gpu
    return -((-q.numerator) // q.denominator)
