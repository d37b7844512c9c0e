"""Closed forms of attention under tensor parallelism (heads per rank): public path of the
``attention.*`` forms of :mod:`distcheck.parallel.tp.forms`."""

from distcheck.parallel.tp.forms import HEADS_PER_RANK, KV_HEADS_PER_RANK

__all__ = ["HEADS_PER_RANK", "KV_HEADS_PER_RANK"]
