"""Gradient-accumulation properties (``accumulation.*``): public path of :mod:`distcheck.parallel.dp.properties`."""

from distcheck.parallel.dp.properties import accumulate, examples_split_invariant, tokens_split_invariant

__all__ = ["accumulate", "tokens_split_invariant", "examples_split_invariant"]
