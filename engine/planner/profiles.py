"""Machine profiles: compute peak, memory and the bandwidth each collective of the engine gets.

Bandwidth model (after the AxoNN paper: "expected bandwidths are calculated based on the number of
collectives using a link"). Ranks are placed in order, `gpus_per_node` consecutive ranks per node. A
group whose members are `stride` ranks apart (x: 1, y: X, z: X*Y, data: X*Y*Z; "x+y": 1, "z+data": X*Y...)
and that has `ranks` members runs a ring:

    inside one package (span stride*ranks <= package_size)   package link: package_gbps
    inside one node    (span <= gpus_per_node)                 GPU-to-GPU link: intra_node_gbps
    across nodes                                               the node's NICs, shared by every group with
                                                               members on the node: min(stride, gpus_per_node)
                                                               rings cross each node boundary at once, so
                                                               each gets inter_node_gbps / that many (and
                                                               never more than intra_node_gbps)

A span that does not divide the node (or package) size straddles a boundary and counts as crossing it.
All figures are GB/s in ONE direction (what a ring uses). Per call, time = steps * latency +
sent_bytes / bandwidth, with 2 (ranks - 1) steps for an all-reduce and ranks - 1 otherwise. A profile written by
`--measure` also holds measured (kind, ranks, stride) figures, which take precedence over the link model.

All-to-all (ZeRO++'s qgZ gradient reduction): each rank sends (ranks - 1) / ranks of its input, as many bytes as a
ring reduce-scatter of the same input, in ranks - 1 exchanges (one per peer), over the same links inside a package
or a node. Across nodes it is no ring: nearly all of every member's bytes leave the node, so all gpus_per_node ranks
of a node send through its NICs at once and each gets inter_node_gbps / gpus_per_node, whatever the stride (for a
ring of stride >= gpus_per_node, such as the outer level of a ZeRO hierarchy, this is the ring's share too; a flat
all-to-all over consecutive ranks gets gpus_per_node times less than a ring there). `--measure` times all-to-alls
like the other kinds; its measured entries take precedence here too.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from engine.spec import AXES

GB = 1e9


@dataclass(frozen=True)
class MeasuredCollective:
    """A collective timed on a real cluster: `ranks` members `stride` ranks apart, all such groups at once.

    latency_s: seconds per ring step; gbps: GB/s of ring-model bytes sent per rank (as engine.core.comm counts).
    """

    kind: str
    ranks: int
    stride: int
    latency_s: float
    gbps: float


@dataclass(frozen=True)
class MachineProfile:
    """One kind of machine. `sources` says where each figure comes from."""

    name: str
    description: str
    gpus_per_node: int
    gpu_memory_gib: float
    peak_tflops: float  # dense bf16 tensor-core peak per GPU (per GCD on Frontier)
    intra_node_gbps: float  # one direction, what one GPU's ring edge to a peer in the node gets
    inter_node_gbps: float  # one direction, all NICs of one node together
    memory_gbps: float = 1000.0  # device memory (HBM) bandwidth per GPU, GB/s: bounds non-matmul work
    package_size: int = 1  # GPUs sharing a faster in-package link (the two GCDs of an MI250X)
    package_gbps: float = 0.0
    intra_latency_s: float = 5e-6
    inter_latency_s: float = 1e-5
    sources: tuple[str, ...] = ()
    measured: tuple[MeasuredCollective, ...] = ()

    def __post_init__(self) -> None:
        if self.gpus_per_node < 1 or self.package_size < 1 or self.gpus_per_node % self.package_size:
            raise ValueError(
                f"profile {self.name}: gpus_per_node ({self.gpus_per_node}) must be a positive "
                f"multiple of package_size ({self.package_size})"
            )
        for f in ("gpu_memory_gib", "peak_tflops", "intra_node_gbps", "inter_node_gbps", "memory_gbps"):
            if not getattr(self, f) > 0:
                raise ValueError(f"profile {self.name}: {f} must be > 0, got {getattr(self, f)!r}")

    def link(self, ranks: int, stride: int, kind: str = "ring") -> tuple[float, float, str]:
        """(bytes per second, seconds per step, link name) that a group of `ranks` members `stride` apart gets
        while every group of its kind runs at once: a ring, or (kind "all_to_all") an all-to-all, whose members
        all send across the node boundary at once (see the module doc)."""
        span = ranks * stride
        if self.package_size > 1 and span <= self.package_size and self.package_size % span == 0:
            return self.package_gbps * GB, self.intra_latency_s, "package"
        if span <= self.gpus_per_node and self.gpus_per_node % span == 0:
            return self.intra_node_gbps * GB, self.intra_latency_s, "node"
        sharing = self.nic_sharing(stride, kind)
        return min(self.intra_node_gbps, self.inter_node_gbps / sharing) * GB, self.inter_latency_s, "network"

    def nic_sharing(self, stride: int, kind: str = "ring") -> int:
        """How many of a node's GPUs send through its NICs at once when every group of `stride` crosses nodes: one
        per ring crossing the boundary (min(stride, gpus_per_node)), or every GPU of the node for an all-to-all."""
        return self.gpus_per_node if kind == "all_to_all" else min(stride, self.gpus_per_node)

    def collective_seconds(self, kind: str, ranks: int, stride: int, sent_bytes: float, calls: int) -> float:
        """Seconds for `calls` calls of a collective that together send `sent_bytes` per rank: all-reduce,
        all-gather and reduce-scatter as rings, all-to-all as ranks - 1 exchanges at link(..., "all_to_all")."""
        if ranks <= 1:
            return 0.0
        steps = (2 if kind == "all_reduce" else 1) * (ranks - 1)
        for m in self.measured:
            if m.kind == kind and m.ranks == ranks and m.stride == stride:
                return calls * steps * m.latency_s + sent_bytes / (m.gbps * GB)
        bandwidth, latency, _ = self.link(ranks, stride, kind)
        return calls * steps * latency + sent_bytes / bandwidth

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["sources"] = list(self.sources)
        out["measured"] = [asdict(m) for m in self.measured]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "MachineProfile":
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown profile fields {sorted(unknown)}; known: {sorted(known)}")
        data = dict(data)
        data["sources"] = tuple(data.get("sources", ()))
        data["measured"] = tuple(MeasuredCollective(**m) for m in data.get("measured", ()))
        return cls(**data)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=2) + "\n")


# Figures: GB/s are per direction. Slingshot 11 NICs run at 200 Gb/s = 25 GB/s per direction; the AxoNN
# paper's summary (seed document 000) states that Perlmutter, Frontier and Alps all have four Slingshot 11
# NICs per node at 25 GB/s each, and gives the GPU memories and the A100's 312 Tflop/s bf16 peak.
PROFILES: dict[str, MachineProfile] = {
    "perlmutter": MachineProfile(
        name="perlmutter",
        description="NERSC Perlmutter GPU node: 4 x NVIDIA A100-SXM4 40GB",
        gpus_per_node=4,
        gpu_memory_gib=40.0,
        peak_tflops=312.0,
        memory_gbps=1555.0,
        # NVLink 3: 12 links of 25 GB/s per direction per A100; on Perlmutter every pair of the 4 GPUs is joined
        # by 4 links, so a ring edge gets 4 x 25 = 100 GB/s
        intra_node_gbps=100.0,
        inter_node_gbps=100.0,
        intra_latency_s=5e-6,
        inter_latency_s=1e-5,
        sources=(
            "AxoNN paper summary (seed 000): 4 Slingshot 11 NICs x 25 GB/s, A100 40GB, 312 Tflop/s bf16",
            "NERSC Perlmutter architecture docs: 4 NVLink 3 links between each pair of A100s",
            "NVIDIA A100 datasheet: NVLink 3 at 25 GB/s per link per direction, 1555 GB/s HBM2 (40GB)",
        ),
    ),
    "frontier": MachineProfile(
        name="frontier",
        description="OLCF Frontier node: 4 x AMD MI250X = 8 GCDs of 64 GB",
        gpus_per_node=8,
        gpu_memory_gib=64.0,
        peak_tflops=191.5,
        memory_gbps=1638.0,
        # the two GCDs of one MI250X: 4 Infinity Fabric links, 200 GB/s per direction; GCDs of different
        # MI250X: 1 or 2 links, 50-100 GB/s: a ring over the node is held to the 50 GB/s edges
        intra_node_gbps=50.0,
        inter_node_gbps=100.0,
        package_size=2,
        package_gbps=200.0,
        intra_latency_s=1e-5,
        inter_latency_s=2e-5,
        sources=(
            "AxoNN paper summary (seed 000): MI250X 128 GB as two 64 GB GCDs, 4 Slingshot 11 NICs x 25 GB/s",
            "OLCF Frontier user guide: GCD-GCD in-package 200 GB/s, across packages 50-100 GB/s",
            "AMD MI250X datasheet: 383 Tflop/s dense bf16 and 3.2768 TB/s HBM2e per MI250X, half per GCD",
        ),
    ),
    "alps": MachineProfile(
        name="alps",
        description="CSCS Alps node: 4 x NVIDIA GH200 (H100 with 96 GB HBM3)",
        gpus_per_node=4,
        gpu_memory_gib=96.0,
        peak_tflops=989.0,
        memory_gbps=4000.0,
        # NVLink 4: 18 links of 25 GB/s per direction per H100; the 4 GH200 of a node are fully connected,
        # 6 links per pair = 150 GB/s per ring edge
        intra_node_gbps=150.0,
        inter_node_gbps=100.0,
        intra_latency_s=5e-6,
        inter_latency_s=1e-5,
        sources=(
            "AxoNN paper summary (seed 000): GH200 with 96 GB per H100, 4 Slingshot 11 NICs x 25 GB/s",
            "NVIDIA H100 SXM datasheet: 989 Tflop/s dense bf16, 18 NVLink 4 links (450 GB/s per direction)",
            "CSCS Alps docs: 4 GH200 per node, all-to-all NVLink",
            "NVIDIA GH200 datasheet: 96 GB HBM3 at 4 TB/s",
        ),
    ),
    "dgx-h100": MachineProfile(
        name="dgx-h100",
        description="NVIDIA DGX H100: 8 x H100-SXM5 80GB on NVSwitch, 8 x 400 Gb/s NICs",
        gpus_per_node=8,
        gpu_memory_gib=80.0,
        peak_tflops=989.0,
        memory_gbps=3350.0,
        # NVSwitch gives every GPU its full 450 GB/s per direction; 8 ConnectX-7 at 400 Gb/s = 50 GB/s each
        intra_node_gbps=450.0,
        inter_node_gbps=400.0,
        intra_latency_s=5e-6,
        inter_latency_s=1e-5,
        sources=(
            "NVIDIA DGX H100 datasheet: 8 H100 80GB, 900 GB/s bidirectional NVLink per GPU, 8 x 400 Gb/s ConnectX-7",
            "NVIDIA H100 SXM datasheet: 989 Tflop/s dense bf16, 3.35 TB/s HBM3",
        ),
    ),
}


def load_profile(name_or_path: str) -> MachineProfile:
    """A named profile (perlmutter, frontier, alps, dgx-h100) or a profile JSON written by --measure."""
    key = name_or_path.lower()
    if key in PROFILES:
        return PROFILES[key]
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        if not path.exists():
            raise ValueError(f"profile file {path} does not exist")
        return MachineProfile.from_json(json.loads(path.read_text()))
    raise ValueError(
        f"unknown machine profile {name_or_path!r}: use one of {', '.join(PROFILES)} or the path of "
        "a profile JSON written by `goldfish plan --measure`"
    )


def group_stride(axes: tuple[str, ...], sizes: dict[str, int]) -> int:
    """Rank distance between consecutive members of the group of `axes` (consecutive axes in the rank order of
    engine.spec.AXES, x fastest, then y, z and data; axes of size one are ignored)."""
    order = AXES
    real = [a for a in order if a in axes and sizes[a] > 1]
    if not real:
        return 1
    first, last = order.index(real[0]), order.index(real[-1])
    if any(sizes[a] > 1 and a not in axes for a in order[first : last + 1]):
        raise ValueError(f"group {axes} is not contiguous in the rank order: its members are not evenly spaced")
    stride = 1
    for a in order[:first]:
        stride *= sizes[a]
    return stride
