"""The hardware catalogue of a step-time plan: each GPU's peak, memory and links, with the vendor's
datasheet for every figure, and the user's overrides.

Units: FLOP/s, bytes (GB = 1e9 bytes, the vendors' GB), bytes per second (GB/s = 1e9 bytes/s; a NIC's
400 Gb/s, in bits, is 50 GB/s), seconds. ``peak_flops`` is the dense bf16 Tensor Core peak: NVIDIA's
datasheets print the figure with 2:4 structured sparsity, twice the dense one, and this catalogue
holds half of it. ``intra_node_bandwidth`` is the datasheet's per-GPU figure for NVLink (or AMD
Infinity Fabric), which counts both directions; a ring sends one way at a time, so the step-time
model uses half of it as the bus bandwidth inside a node. ``inter_node_bandwidth`` is one GPU's
network link, one way: the DGX datasheets give each GPU its own NIC. The three latencies are not
the GPU's: they are NCCL's own model of a ring collective (``src/graph/tuning.cc``, NCCL 2.30, ring
algorithm, Simple protocol), the same for every entry.

A datasheet figure is a peak: the plan reaches it only through its stated assumptions (an
achievable fraction of ``peak_flops``, overlaps). Every figure can be overridden
(:meth:`Accelerator.with_overrides`, ``--hw KEY=VALUE`` on the command line).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from fractions import Fraction
from typing import Any

from distcheck.core.errors import ConfigError
from distcheck.core.units import parse_bandwidth, parse_bytes, parse_flop_rate, parse_seconds
from distcheck.core.validate import check_choice, check_positive_int
from distcheck.parallel.comm.ideal import NCCL_LATENCY_S

__all__ = ["Accelerator", "ACCELERATORS", "FIGURES", "accelerator", "parse_overrides", "parse_figure"]

#: the figures of an entry that a user may override, with the unit each is written in
FIGURES = {
    "peak_flops": "FLOP/s, e.g. '989.5 TFLOP/s'",
    "hbm_bytes": "bytes, e.g. '80 GB'",
    "hbm_bandwidth": "bytes/s, e.g. '3.35 TB/s'",
    "intra_node_bandwidth": "bytes/s per GPU, both directions, e.g. '900 GB/s'",
    "gpus_per_node": "GPUs, e.g. 8",
    "inter_node_bandwidth": "bytes/s per GPU, one way, e.g. '50 GB/s' or '400 Gb/s'",
    "latency_base": "seconds per collective, e.g. '8.4 us'",
    "latency_intra": "seconds per ring step inside a node, e.g. '3.4 us'",
    "latency_inter": "seconds per ring step across nodes, e.g. '14 us'",
}

_NCCL = "NCCL 2.30 src/graph/tuning.cc, ring algorithm, Simple protocol"
_LATENCY_SOURCES = {"latency_base": f"{_NCCL}: base latency 8.4 us per collective",
                    "latency_intra": f"{_NCCL}: 3.4 us per NVLink step",
                    "latency_inter": f"{_NCCL}: 14 us per network step"}


@dataclass(frozen=True)
class Accelerator:
    """One GPU and the server it comes in (module doc for the units and conventions).

    Attributes:
        name: the catalogue key (``"h100-sxm"``); title: the product's name.
        peak_flops: dense bf16 Tensor Core peak, FLOP/s.
        hbm_bytes: memory of one GPU, bytes; hbm_bandwidth: its bandwidth, bytes/s.
        intra_node_bandwidth: per-GPU NVLink / Infinity Fabric bandwidth, both directions, bytes/s.
        gpus_per_node: GPUs in one server.
        inter_node_bandwidth: one GPU's network bandwidth, one way, bytes/s.
        latency_base, latency_intra, latency_inter: seconds per collective, per ring step inside a node
            and across nodes (NCCL's model).
        sources: ``(figure, citation)`` pairs, one per figure: the vendor datasheet by its public title.

    Raises ConfigError naming the figure when one is not a positive exact number (latencies may be 0).
    """

    name: str
    title: str
    peak_flops: Fraction
    hbm_bytes: int | Fraction
    hbm_bandwidth: Fraction
    intra_node_bandwidth: Fraction
    gpus_per_node: int
    inter_node_bandwidth: Fraction
    latency_base: Fraction = NCCL_LATENCY_S["base"]
    latency_intra: Fraction = NCCL_LATENCY_S["intra"]
    latency_inter: Fraction = NCCL_LATENCY_S["inter"]
    sources: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        check_positive_int("gpus_per_node", self.gpus_per_node)
        for f in ("peak_flops", "hbm_bytes", "hbm_bandwidth", "intra_node_bandwidth", "inter_node_bandwidth",
                  "latency_base", "latency_intra", "latency_inter"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, Fraction)):
                raise ConfigError(f, v, "must be an exact number (int or Fraction)")
            if v < 0 or (v == 0 and not f.startswith("latency")):
                raise ConfigError(f, v, "must be >= 0" if f.startswith("latency") else "must be > 0")
        missing = [f for f in FIGURES if f not in dict(self.sources)]
        if missing:
            raise ConfigError("sources", self.name, f"must cite every figure; missing {', '.join(missing)}")

    @property
    def intra_node_busbw(self) -> Fraction:
        """The bus bandwidth of a ring inside a node, bytes/s: half the datasheet's two-way figure."""
        return Fraction(self.intra_node_bandwidth) / 2

    def source(self, figure: str) -> str:
        """The citation of ``figure`` (a key of :data:`FIGURES`)."""
        return dict(self.sources)[check_choice("figure", figure, tuple(FIGURES))]

    def with_overrides(self, overrides: Mapping[str, Any]) -> Accelerator:
        """A copy with the figures of ``overrides`` replaced (values already in the figure's unit, or
        strings with units, :func:`parse_overrides`); each replaced figure is cited as a user override.
        Raises ConfigError for an unknown figure or a bad value."""
        parsed: dict[str, Any] = {k: _parse_figure(k, v) for k, v in overrides.items()}
        if not parsed:
            return self
        mark = "user override (--hw, --gpus-per-node or --gpu-memory)"
        cited = tuple((f, mark if f in parsed else c) for f, c in self.sources)
        return replace(self, **parsed, sources=cited)

    def as_dict(self) -> dict[str, Any]:
        """The figures and their sources (exact numbers as they are)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "sources"}
        out["sources"] = dict(self.sources)
        return out


def _parse_figure(key: str, value: Any) -> int | Fraction:
    check_choice("--hw", key, tuple(FIGURES))
    if isinstance(value, str):
        text = value.strip()
        if key == "gpus_per_node":
            if not text.isdigit():
                raise ConfigError(key, value, "must be a whole number of GPUs")
            return check_positive_int(key, int(text))
        if key == "peak_flops":
            return parse_flop_rate(text, key)
        if key == "hbm_bytes":
            n = parse_bytes(text)
            if n <= 0:
                raise ConfigError(key, value, "must be > 0")
            return n
        if key.startswith("latency"):
            return parse_seconds(text, key, allow_zero=True)
        return parse_bandwidth(text, key)
    if isinstance(value, bool) or not isinstance(value, (int, Fraction)):
        raise ConfigError(key, value, f"must be a number in {FIGURES[key]}")
    if key == "gpus_per_node":
        return check_positive_int(key, value)
    if value < 0 or (value == 0 and not key.startswith("latency")):
        raise ConfigError(key, value, "must be > 0")
    return value


def parse_overrides(items: Sequence[str] | None) -> dict[str, int | Fraction]:
    """``["peak_flops=800 TFLOP/s", "inter_node_bandwidth=25 GB/s"]`` -> the figures, parsed with their units.
    Raises ConfigError naming ``--hw`` for an item without ``=``, an unknown figure (listing them) or a repeated
    one, and naming the figure for a value that does not parse."""
    out: dict[str, int | Fraction] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError("--hw", item, f"must be KEY=VALUE, KEY one of {', '.join(FIGURES)}")
        if key not in FIGURES:
            raise ConfigError("--hw", key, f"is not a figure of the hardware catalogue ({', '.join(FIGURES)})")
        if key in out:
            raise ConfigError("--hw", key, "is given twice")
        out[key] = parse_figure(key, value, f"--hw {key}")
    return out


def parse_figure(key: str, value: Any, field: str | None = None) -> int | Fraction:
    """One figure of :data:`FIGURES` from a string with its unit (or an exact number in the figure's unit).
    Raises ConfigError naming ``field`` (default: ``key``) when it does not parse or is out of range."""
    try:
        return _parse_figure(key, value)
    except ConfigError as exc:
        if field is None or exc.field == "--hw":
            raise
        raise ConfigError(field, value, exc.rule) from None


def _gbs(x: int | str) -> Fraction:
    return parse_bandwidth(x) if isinstance(x, str) else Fraction(x)


def _entry(name: str, title: str, *, peak: str, hbm: str, hbm_bw: str, intra: str, gpn: int, inter: str,
           cite: dict[str, str]) -> Accelerator:
    return Accelerator(name=name, title=title, peak_flops=parse_flop_rate(peak), hbm_bytes=parse_bytes(hbm),
                       hbm_bandwidth=_gbs(hbm_bw), intra_node_bandwidth=_gbs(intra), gpus_per_node=gpn,
                       inter_node_bandwidth=_gbs(inter), sources=tuple({**cite, **_LATENCY_SOURCES}.items()))


_H100 = "NVIDIA H100 Tensor Core GPU Datasheet (H100 SXM column)"
_H200 = "NVIDIA H200 Tensor Core GPU Datasheet (H200 SXM column)"
_A100 = "NVIDIA A100 Tensor Core GPU Datasheet (A100 80GB SXM column)"
_DGX_H100 = "NVIDIA DGX H100 Datasheet"
_DGX_H200 = "NVIDIA DGX H200 Datasheet"
_DGX_A100 = "NVIDIA DGX A100 Datasheet"
_DGX_B200 = "NVIDIA DGX B200 Datasheet"
_HGX = "NVIDIA HGX Platform Datasheet (HGX B200 column)"
_MI300X = "AMD Instinct MI300X Accelerator Data Sheet"
_MI300X_PLATFORM = "AMD Instinct MI300X Platform Data Sheet"

#: the catalogue by name: H100 SXM, H200, A100 80GB, B200, MI300X
ACCELERATORS: dict[str, Accelerator] = {a.name: a for a in (
    _entry("h100-sxm", "NVIDIA H100 SXM", peak="989.5 TFLOP/s", hbm="80 GB", hbm_bw="3.35 TB/s", intra="900 GB/s",
           gpn=8, inter="400 Gb/s", cite={
               "peak_flops": f"{_H100}: BF16 Tensor Core 1,979 teraFLOPS with sparsity; dense is half",
               "hbm_bytes": f"{_H100}: GPU memory 80GB", "hbm_bandwidth": f"{_H100}: GPU memory bandwidth 3.35TB/s",
               "intra_node_bandwidth": f"{_H100}: NVLink 900GB/s",
               "gpus_per_node": f"{_DGX_H100}: 8x NVIDIA H100 Tensor Core GPUs",
               "inter_node_bandwidth": f"{_DGX_H100}: 8x single-port NVIDIA ConnectX-7 VPI, 400Gb/s, one per GPU"}),
    _entry("h200", "NVIDIA H200 SXM", peak="989.5 TFLOP/s", hbm="141 GB", hbm_bw="4.8 TB/s", intra="900 GB/s",
           gpn=8, inter="400 Gb/s", cite={
               "peak_flops": f"{_H200}: BF16 Tensor Core 1,979 TFLOPS with sparsity; dense is half",
               "hbm_bytes": f"{_H200}: GPU memory 141GB", "hbm_bandwidth": f"{_H200}: GPU memory bandwidth 4.8TB/s",
               "intra_node_bandwidth": f"{_H200}: NVIDIA NVLink 900GB/s",
               "gpus_per_node": f"{_DGX_H200}: 8x NVIDIA H200 Tensor Core GPUs",
               "inter_node_bandwidth": f"{_DGX_H200}: 8x single-port NVIDIA ConnectX-7 VPI, 400Gb/s, one per GPU"}),
    _entry("a100-80gb", "NVIDIA A100 80GB SXM", peak="312 TFLOP/s", hbm="80 GB", hbm_bw="2039 GB/s", intra="600 GB/s",
           gpn=8, inter="200 Gb/s", cite={
               "peak_flops": f"{_A100}: BFLOAT16 Tensor Core 312 TFLOPS (624 with sparsity)",
               "hbm_bytes": f"{_A100}: GPU memory 80GB HBM2e",
               "hbm_bandwidth": f"{_A100}: GPU memory bandwidth 2,039GB/s",
               "intra_node_bandwidth": f"{_A100}: NVLink 600GB/s",
               "gpus_per_node": f"{_DGX_A100}: 8x NVIDIA A100 80GB Tensor Core GPUs",
               "inter_node_bandwidth": f"{_DGX_A100}: 8x single-port ConnectX-6 VPI, 200Gb/s HDR InfiniBand, one per "
                                       "GPU"}),
    _entry("b200", "NVIDIA B200 (HGX / DGX B200)", peak="2250 TFLOP/s", hbm="180 GB", hbm_bw="8 TB/s",
           intra="1800 GB/s", gpn=8, inter="400 Gb/s", cite={
               "peak_flops": f"{_HGX}: FP16/BF16 Tensor Core 36 PFLOPS with sparsity for 8 GPUs, 4.5 per GPU; dense "
                             "is half",
               "hbm_bytes": f"{_DGX_B200}: 1,440GB total GPU memory over 8 GPUs",
               "hbm_bandwidth": f"{_DGX_B200}: 64TB/s HBM3e bandwidth over 8 GPUs",
               "intra_node_bandwidth": f"{_DGX_B200}: 14.4TB/s aggregate NVLink bandwidth over 8 GPUs (fifth-"
                                       "generation NVLink, 1.8TB/s per GPU)",
               "gpus_per_node": f"{_DGX_B200}: 8x NVIDIA Blackwell GPUs",
               "inter_node_bandwidth": f"{_DGX_B200}: 8x single-port NVIDIA ConnectX-7 VPI, up to 400Gb/s, one per "
                                       "GPU"}),
    _entry("mi300x", "AMD Instinct MI300X", peak="1307.4 TFLOP/s", hbm="192 GB", hbm_bw="5.3 TB/s", intra="896 GB/s",
           gpn=8, inter="400 Gb/s", cite={
               "peak_flops": f"{_MI300X}: peak BFloat16 1,307.4 TFLOPs (2,614.9 with structured sparsity)",
               "hbm_bytes": f"{_MI300X}: 192GB HBM3", "hbm_bandwidth": f"{_MI300X}: peak memory bandwidth 5.3TB/s",
               "intra_node_bandwidth": f"{_MI300X_PLATFORM}: 896GB/s aggregate peer-to-peer Infinity Fabric "
                                       "bandwidth per GPU (7 links of 128GB/s)",
               "gpus_per_node": f"{_MI300X_PLATFORM}: 8 MI300X OAM accelerators",
               "inter_node_bandwidth": "not on AMD's data sheets: a 400Gb/s NIC per GPU assumed, as the NVIDIA DGX "
                                       "datasheets give (override with --hw inter_node_bandwidth=...)"}),
)}


def accelerator(name: str, overrides: Mapping[str, Any] | None = None) -> Accelerator:
    """The catalogue entry ``name`` (a key of :data:`ACCELERATORS`), with ``overrides`` applied
    (:meth:`Accelerator.with_overrides`). Raises ConfigError for an unknown name or a bad override."""
    entry = ACCELERATORS[check_choice("hardware", name, tuple(ACCELERATORS))]
    return entry.with_overrides(overrides or {})
