"""Profile the current cluster: time the engine's collectives for every group size and placement.

Run on every rank of a torchrun (or SLURM) world, e.g.

    torchrun --nnodes 2 --nproc-per-node 4 -m goldfish plan --measure profile.json --profile perlmutter

For every group size p >= 2 and stride s (members s ranks apart) with p*s dividing the world, all groups of
that shape run the collective AT ONCE, as the groups of one grid axis do in training, so links shared
between groups show up in the timings. Each of all-reduce, all-gather, reduce-scatter and all-to-all is timed at a
small message (latency) and a large one (bandwidth): each call starts after a barrier, the slowest rank
counts, and the median call is kept (robust to a shared machine's noise). A GEMM is timed on every
rank at once for the compute rate, and a large copy for the memory bandwidth. The result is a
MachineProfile whose measured entries the planner uses directly, with intra-/inter-node figures fitted
from them for placements that were not measured.
"""

from __future__ import annotations

import os
import socket
import statistics
import time
from dataclasses import replace

import torch
import torch.distributed as dist

from engine.core import comm
from engine.core.grid import AxisGroup, ByteCounter, init
from engine.planner.cost_model import KINDS, Collective
from engine.planner.profiles import MachineProfile, MeasuredCollective

GIB = 1024**3


def placements(world: int) -> list[tuple[int, int]]:
    """(ranks, stride) of every group shape with ranks >= 2 and ranks * stride dividing `world`."""
    return [(p, s) for p in range(2, world + 1) for s in range(1, world // p + 1) if world % (p * s) == 0]


def partition(world: int, ranks: int, stride: int) -> list[list[int]]:
    """The groups of `ranks` members `stride` apart that cover 0..world-1."""
    span = ranks * stride
    return [
        [base + offset + k * stride for k in range(ranks)] for base in range(0, world, span) for offset in range(stride)
    ]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_collective(
    kind: str, group: AxisGroup, n_bytes: int, dtype: torch.dtype, device: torch.device, iters: int
) -> float:
    """Seconds per call (slowest rank) of `kind` whose full tensor has about n_bytes; every rank calls."""
    size = torch.tensor([], dtype=dtype).element_size()
    elements = max(group.size, n_bytes // size // group.size * group.size)
    if kind == "all_gather":
        t = torch.ones(elements // group.size, dtype=dtype, device=device)
        run = lambda: comm.all_gather(t, group)  # noqa: E731
    elif kind == "reduce_scatter":
        t = torch.ones(elements, dtype=dtype, device=device)
        run = lambda: comm.reduce_scatter(t, group)  # noqa: E731
    elif kind == "all_to_all":  # qgZ's exchange of quantized rows
        t = torch.ones(group.size, elements // group.size, dtype=dtype, device=device)
        run = lambda: comm.all_to_all(t, group)  # noqa: E731
    else:
        t = torch.ones(elements, dtype=dtype, device=device)
        run = lambda: comm.all_reduce(t, group)  # noqa: E731
    run()
    return _median_call(run, device, iters)


def _median_call(run, device: torch.device, iters: int) -> float:
    """Median over `iters` calls of the slowest rank's seconds for one call of `run`, each call started
    together after a barrier: robust to the scheduling noise of a shared machine."""
    seconds = torch.empty(iters, dtype=torch.float64, device=device)
    for i in range(iters):
        _sync(device)
        dist.barrier()
        start = time.perf_counter()
        run()
        _sync(device)
        seconds[i] = time.perf_counter() - start
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    return float(seconds.median())


def _gemm_tflops(dtype: torch.dtype, device: torch.device, n: int, iters: int) -> float:
    """Dense matmul rate (Tflop/s) of one rank while every rank multiplies at once (slowest rank)."""
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    a @ b
    return 2 * n**3 / _median_call(lambda: a @ b, device, iters) / 1e12


def _memory_gbps(device: torch.device, n_bytes: int, iters: int) -> float:
    """Device-memory bandwidth (GB/s read + written) of one rank copying a tensor while every rank copies."""
    a = torch.ones(n_bytes // 4, dtype=torch.float32, device=device)
    b = torch.empty_like(a)
    b.copy_(a)
    return 2 * a.numel() * 4 / _median_call(lambda: b.copy_(a), device, iters) / 1e9


def measure_profile(
    base: MachineProfile,
    *,
    small_bytes: int = 1 << 16,
    large_bytes: int = 1 << 26,
    iters: int = 10,
    gemm_size: int | None = None,
) -> MachineProfile | None:
    """Measure this torchrun world (every rank must call); rank 0 gets the profile, the others None.

    Figures the measurement cannot give (GPU memory on CPU, the inter-node bandwidth on one node) come
    from `base`. Tensors are bf16 on CUDA and float32 on CPU (gloo).
    """
    if not 0 < small_bytes < large_bytes:
        raise ValueError(f"need 0 < small_bytes < large_bytes, got {small_bytes} and {large_bytes}")
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    world = dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", "1"))
    grid = init(data=world)  # starts torch.distributed from the torchrun/SLURM environment if needed
    device, rank = grid.device, grid.rank
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", 0)) or (
        base.gpus_per_node if world % base.gpus_per_node == 0 else world
    )
    created: list[dist.ProcessGroup] = []
    entries: list[MeasuredCollective] = []
    try:
        for ranks, stride in placements(world):
            mine = None
            for members in partition(world, ranks, stride):
                handle = dist.group.WORLD if ranks == world else dist.new_group(members)
                if handle is not dist.group.WORLD:
                    created.append(handle)
                if rank in members:
                    mine = AxisGroup(
                        f"p{ranks}s{stride}", (), ranks, members.index(rank), tuple(members), handle, ByteCounter()
                    )
            assert mine is not None
            for kind in KINDS:
                seconds = {}
                sent = {}
                for n_bytes in (small_bytes, large_bytes):
                    seconds[n_bytes] = _time_collective(kind, mine, n_bytes, dtype, device, iters)
                    sent[n_bytes] = Collective("probe", kind, ranks, n_bytes, "forward", "probe").sent_per_call
                probe = Collective("probe", kind, ranks, large_bytes, "forward", "probe")
                extra = seconds[large_bytes] - seconds[small_bytes]
                gbps = (
                    (sent[large_bytes] - sent[small_bytes]) / extra
                    if extra > 0
                    else sent[large_bytes] / seconds[large_bytes]
                ) / 1e9
                entries.append(MeasuredCollective(kind, ranks, stride, seconds[small_bytes] / probe.ring_steps, gbps))
        n = gemm_size or (4096 if device.type == "cuda" else 512)
        tflops = _gemm_tflops(dtype, device, n, max(2, iters))
        memory_gbps = _memory_gbps(device, (1 << 30) if device.type == "cuda" else (1 << 26), max(2, iters))
    finally:
        for handle in created:
            dist.destroy_process_group(handle)
        grid.close()
    if rank != 0:
        return None
    return fit_profile(
        base,
        entries,
        world=world,
        gpus_per_node=per_node,
        peak_tflops=tflops,
        memory_gib=_device_memory_gib(device, per_node, base),
        memory_gbps=memory_gbps,
    )


def _device_memory_gib(device: torch.device, per_node: int, base: MachineProfile) -> float:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory / GIB
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB / per_node
    except (ValueError, OSError):
        return base.gpu_memory_gib


def fit_profile(
    base: MachineProfile,
    entries: list[MeasuredCollective],
    *,
    world: int,
    gpus_per_node: int,
    peak_tflops: float,
    memory_gib: float,
    memory_gbps: float,
) -> MachineProfile:
    """A profile holding the measured entries, with link figures fitted from them (median over placements):
    intra-node GB/s from groups inside a node, inter-node GB/s of a whole node from groups that cross nodes
    (each measured figure times the number of groups sharing the node's NICs). Unmeasured kinds of link keep
    `base`'s figures."""
    probe = replace(base, gpus_per_node=gpus_per_node, package_size=1, package_gbps=0.0, measured=())
    intra, inter, intra_lat, inter_lat = [], [], [], []
    for e in entries:
        _, _, where = probe.link(e.ranks, e.stride, e.kind)
        if where == "network":  # the node's NICs carry every sharing group's bytes at once
            inter.append(e.gbps * probe.nic_sharing(e.stride, e.kind))
            inter_lat.append(e.latency_s)
        else:
            intra.append(e.gbps)
            intra_lat.append(e.latency_s)
    intra_gbps = statistics.median(intra) if intra else base.intra_node_gbps
    inter_gbps = statistics.median(inter) if inter else base.inter_node_gbps
    nodes = max(1, world // gpus_per_node)
    return replace(
        probe,
        name=f"measured-{socket.gethostname()}",
        description=f"measured on {nodes} node(s) x {gpus_per_node} ranks; peak_tflops and memory_gbps are the "
        f"measured GEMM and copy rates with every rank busy; link figures not measured come from "
        f"{base.name}",
        gpu_memory_gib=memory_gib,
        peak_tflops=peak_tflops,
        memory_gbps=memory_gbps,
        intra_node_gbps=intra_gbps,
        inter_node_gbps=inter_gbps,
        intra_latency_s=statistics.median(intra_lat) if intra_lat else base.intra_latency_s,
        inter_latency_s=statistics.median(inter_lat) if inter_lat else base.inter_latency_s,
        sources=(f"engine.planner.measure on {world} ranks", *base.sources),
        measured=tuple(entries),
    )
