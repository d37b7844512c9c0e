"""Ideal bytes each rank sends per collective, exactly: nccl-tests' bus-bandwidth factors.

Size conventions (:data:`CONVENTIONS`): ``"full"`` (nccl-tests doc/PERFORMANCE.md) takes
``S`` = the FULL tensor; ``"shard"`` takes the per-rank shard ``s = S/n`` that some sources
quote (the chapter "Chapter 26: Distributed Training" of *Language Modelling: The Complete
Guide* writes ``model_size/world_size``). The simulations that move real arrays and count
the bytes are :mod:`distcheck.parallel.comm.reference`.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from distcheck.core.errors import ConfigError
from distcheck.core.validate import check_choice, check_positive_int
from distcheck.core.vocab import Collective, names

__all__ = ["COLLECTIVES", "CONVENTIONS", "NCCL_LATENCY_S", "bus_bandwidth_factor", "volume", "ring_steps",
           "ring_time"]

#: the collectives with an ideal per-rank volume, by name (:class:`distcheck.core.vocab.Collective`)
COLLECTIVES = names(Collective)

#: size conventions a source may use, by name (the audit names them)
CONVENTIONS = {
    "full": "S is the full tensor (nccl-tests); per-rank bytes sent = factor(n) * S",
    "shard": "s = S/n is the per-rank shard (e.g. the chapter's model_size/world_size); bytes sent = factor(n) * n * s",
}


#: NCCL 2.30's latencies of the ring algorithm, Simple protocol, in seconds (src/graph/tuning.cc: baseLatencies
#: 8.4 us per collective; hwLatencies 3.4 us per NVLink step, 14.0 us per network step); the defaults of
#: ``comm.time_s.*``
NCCL_LATENCY_S = {"base": Fraction(84, 10**7), "intra": Fraction(34, 10**7), "inter": Fraction(14, 10**6)}

#: the ring collectives NCCL's latency model covers here
_RING = (Collective.ALL_REDUCE, Collective.ALL_GATHER, Collective.REDUCE_SCATTER)


def bus_bandwidth_factor(collective: str, n: int) -> Fraction:
    """nccl-tests' busbw/algbw factor: 2(n-1)/n, (n-1)/n (all-gather, reduce-scatter, all-to-all) or 1 (broadcast).

    Source: nccl-tests doc/PERFORMANCE.md. Raises ConfigError for an unknown
    collective or n < 1.
    """
    check_choice("collective", collective, COLLECTIVES)
    n = check_positive_int("n", n)
    if collective == Collective.ALL_REDUCE:
        return Fraction(2 * (n - 1), n)
    if collective == Collective.BROADCAST:
        return Fraction(1)
    return Fraction(n - 1, n)


def volume(collective: str, size_bytes: int | Fraction, n: int, convention: str = "full") -> Fraction:
    """Ideal bytes each rank sends (exact Fraction), per nccl-tests doc/PERFORMANCE.md.

    - ``convention="full"``: ``size_bytes`` is S, the full tensor; returns
      ``bus_bandwidth_factor(collective, n) * S``.
    - ``convention="shard"``: ``size_bytes`` is the per-rank shard ``s = S/n``;
      returns the same volume for ``S = n*s`` (e.g. all-gather: ``(n-1)*s``).
      Not defined for broadcast (the root holds the whole tensor).

    Broadcast with n = 1 returns 0 (nothing to send); the factor-1 form holds for n >= 2.
    ``size_bytes`` is an int or Fraction (bytes; convert from GB/GiB with
    :func:`distcheck.core.units.to_bytes`), the result an exact Fraction of bytes.
    Raises ConfigError for an unknown collective or convention, n < 1, a size
    that is not an int/Fraction, or a size < 0.
    """
    check_choice("collective", collective, COLLECTIVES)
    check_choice("convention", convention, tuple(CONVENTIONS))
    n = check_positive_int("n", n)
    if isinstance(size_bytes, bool) or not isinstance(size_bytes, (int, np.integer, Fraction)):
        raise ConfigError("size_bytes", size_bytes, "must be an int or Fraction number of bytes")
    size = Fraction(int(size_bytes) if isinstance(size_bytes, np.integer) else size_bytes)
    if size < 0:
        raise ConfigError("size_bytes", size_bytes, "must be >= 0")
    if convention == "shard":
        if collective == Collective.BROADCAST:
            raise ConfigError("convention", convention, "does not apply to broadcast (the root holds the whole tensor)")
        size = size * n
    if collective == Collective.BROADCAST and n == 1:
        return Fraction(0)
    return bus_bandwidth_factor(collective, n) * size


def ring_steps(collective: str, n: int, nodes: int = 1) -> tuple[int, int]:
    """``(steps, across)``: the ring steps of ``collective`` on ``n`` ranks spanning ``nodes`` nodes, and how many
    of them cross the network (NCCL src/graph/tuning.cc: an all-reduce takes 2(n-1) steps, 2(nodes-1) across;
    an all-gather or a reduce-scatter n-1, nodes-1 across). Raises ConfigError for another collective, n or
    nodes < 1, or nodes > n."""
    check_choice("collective", collective, _RING)
    n, nodes = check_positive_int("n", n), check_positive_int("nodes", nodes)
    if nodes > n:
        raise ConfigError("nodes", nodes, f"must be at most n={n} (a node holds at least one rank of the group)")
    k = 2 if collective == Collective.ALL_REDUCE else 1
    return k * (n - 1), k * (nodes - 1)


def ring_time(collective: str, size_bytes: int | Fraction, n: int, busbw: int | Fraction, nodes: int = 1, *,
              latency: dict[str, Fraction] | None = None) -> Fraction:
    """Seconds of a ring ``collective`` over the full tensor ``size_bytes`` on ``n`` ranks (``comm.time_s.ring.*``):
    ``latency["base"]`` + the ring steps inside a node x ``latency["intra"]`` + those across x ``latency["inter"]``
    + :func:`volume` / ``busbw`` (bytes/s). ``latency`` defaults to :data:`NCCL_LATENCY_S`. Raises ConfigError as
    :func:`ring_steps` and :func:`volume`, or for a busbw that is not > 0."""
    steps, across = ring_steps(collective, n, nodes)
    if isinstance(busbw, bool) or not isinstance(busbw, (int, Fraction)) or busbw <= 0:
        raise ConfigError("busbw", busbw, "must be a positive exact number of bytes per second")
    lat = NCCL_LATENCY_S if latency is None else latency
    return (lat["base"] + (steps - across) * lat["intra"] + across * lat["inter"]
            + volume(collective, size_bytes, n) / Fraction(busbw))
