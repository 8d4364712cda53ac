"""Benchmark: the engine's tensor parallelism against torch's own DTensor tensor parallelism, on gloo.

Usage: python bench/tp_vs_dtensor.py [--degrees 2 4] [--steps 8] [--hidden 256] [--layers 2] [--batch 8]
                                     [--seq 128] [--vocab 2048]

For each degree N, N processes (torch.multiprocessing spawn, gloo, one thread each) build the same HF
Llama (same seed, fp32) several times and train each copy on the same global batch of `batch` rows:

    torch   torch.distributed.tensor.parallel.parallelize_module on a 1-D mesh of N ranks with the
            Megatron plan: ColwiseParallel for q/k/v/gate/up, RowwiseParallel for o/down; embeddings,
            norms and lm_head replicated. Every rank feeds all `batch` rows (tensor parallelism proper).
    ours    engine.parallelize on grids y=N (the same Megatron split: heads and MLP columns over y),
            x=N (input features over x) and, for N=4, x=2,y=2. Each rank feeds its own batch/N rows (the
            engine's data-parallel view from outside; the decoder runs on the rows of the x*y group),
            then engine.sync_gradients.

A step is forward, summed token loss over the global batch divided by its token count, backward, (ours:
sync_gradients), AdamW step; no clipping. Steps of all copies are interleaved (the order rotates), each
copy is warmed up, and the step time is rank 0's median. Bytes are what each rank sends per step under a
ring model (all-reduce of n bytes over p ranks: 2n(p-1)/p; all-gather and reduce-scatter with full size
n: n(p-1)/p): ours from the engine's own counters (grid.traffic); torch's counted from the functional
collectives that DTensor issues, observed with torch's CommDebugMode (a subclass that also sums their
sizes), so both use the same model of bytes. First-step losses are printed to show that all copies
compute the same model.

A 2-core machine runs N processes on 2 cores: the times compare the two implementations under the same
conditions, they are not a measure of speed-up.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections import defaultdict
from typing import Any

import common
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

_RING_KINDS = {  # functional collective -> how its bytes are counted
    "all_reduce": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "all_gather_into_tensor": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_to_all_single": "all_to_all",
    "broadcast": "broadcast",
}


def build_model(args: argparse.Namespace) -> torch.nn.Module:
    return common.build_llama(**common.model_shape(args), heads=args.hidden // 32)


def byte_counting_mode() -> Any:
    """A CommDebugMode that also sums the ring-model bytes this rank sends in each functional collective."""
    from torch.distributed.distributed_c10d import _resolve_process_group
    from torch.distributed.tensor.debug import CommDebugMode

    def nbytes(t: torch.Tensor) -> int:
        return t.numel() * t.element_size()

    class ByteCountingCommMode(CommDebugMode):
        def __init__(self) -> None:
            super().__init__()
            self.sent: dict[str, float] = defaultdict(float)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = super().__torch_dispatch__(func, types, args, kwargs)
            packet = getattr(func, "_overloadpacket", None)
            kind = _RING_KINDS.get(getattr(packet, "__name__", ""))
            if out is not NotImplemented and kind is not None and "_c10d_functional" in str(packet):
                tensors = args[0] if isinstance(args[0], (list, tuple)) else [args[0]]
                size = _resolve_process_group(args[-1]).size()
                total = sum(nbytes(t) for t in tensors)
                if kind == "all_reduce":
                    self.sent[kind] += 2 * total * (size - 1) / size
                elif kind == "all_gather":  # input is one rank's piece: the full tensor is size times it
                    self.sent[kind] += total * (size - 1)
                else:  # reduce-scatter and all-to-all: the input is the full tensor; broadcast: upper bound
                    self.sent[kind] += total * (size - 1) / size
            return out

    return ByteCountingCommMode()


def torch_tp(model: torch.nn.Module, world: int) -> torch.nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (world,))
    plan = {
        "self_attn.q_proj": ColwiseParallel(),
        "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(),
        "self_attn.o_proj": RowwiseParallel(),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(),
    }
    for layer in model.model.layers:
        parallelize_module(layer, mesh, plan)
    return model


def worker(rank: int, world: int, port: int, args: argparse.Namespace, results: Any) -> None:
    torch.set_num_threads(1)
    # CommDebugMode's module tracker hooks HF modules whose outputs are not tensors: harmless, say it once here
    warnings.filterwarnings("ignore", message="For backward hooks to be called")
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        import engine

        grids = {f"ours y={world}": engine.init(y=world), f"ours x={world}": engine.init(x=world)}
        if world == 4:
            grids["ours x=2,y=2"] = engine.init(x=2, y=2)
        copies: dict[str, tuple[torch.nn.Module, Any]] = {
            "torch DTensor TP": (torch_tp(build_model(args), world), None)
        }
        for name, grid in grids.items():
            copies[name] = (engine.parallelize(build_model(args), grid), grid)
        optimizers = {name: torch.optim.AdamW(model.parameters(), lr=1e-4) for name, (model, _) in copies.items()}
        generator = torch.Generator().manual_seed(0)
        batches = [torch.randint(0, args.vocab, (args.batch, args.seq), generator=generator) for _ in range(3)]
        n_tokens = args.batch * (args.seq - 1)

        def step(name: str, index: int) -> tuple[float, float]:
            model, grid = copies[name]
            ids = batches[index % len(batches)]
            if grid is not None:  # ours: this rank's rows
                share = args.batch // world
                ids = ids[rank * share : (rank + 1) * share]
            dist.barrier()
            start = time.perf_counter()
            logits = model(input_ids=ids).logits
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten(), reduction="sum") / n_tokens
            loss.backward()
            if grid is not None:
                engine.sync_gradients(model, grid)
            optimizers[name].step()
            optimizers[name].zero_grad(set_to_none=True)
            seconds = time.perf_counter() - start
            value = loss.detach().reshape(1)
            if grid is not None:  # the global loss: sum of the ranks' shares (not timed)
                dist.all_reduce(value)
            return seconds, float(value)

        names = list(copies)
        # one counted step each: bytes per step and the first-step loss
        sent, first_loss = {}, {}
        for name in names:
            model, grid = copies[name]
            if grid is None:
                mode = byte_counting_mode()
                with mode:
                    _, first_loss[name] = step(name, 0)
                sent[name] = (dict(mode.sent), {str(k): v for k, v in mode.get_comm_counts().items()})
            else:
                grid.traffic.enabled = True
                _, first_loss[name] = step(name, 0)
                grid.traffic.enabled = False
                sent[name] = (grid.traffic.reset(), None)
        times: dict[str, list[float]] = {name: [] for name in names}
        for index in range(1, 1 + args.warmup + args.steps):
            for name in names[index % len(names) :] + names[: index % len(names)]:
                seconds, _ = step(name, index)
                if index > args.warmup:
                    times[name].append(seconds)
        if rank == 0:
            results.put({"world": world, "times": times, "sent": sent, "first_loss": first_loss})
        for grid in grids.values():
            grid.close()
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--degrees", type=int, nargs="+", default=[2, 4])
    common.add_options(
        parser, help={"steps": "measured steps per copy"}, steps=8, warmup=2, vocab=2048, hidden=256, layers=2, seq=128
    )
    parser.add_argument("--batch", type=int, default=8)
    args = common.parse(parser)
    for degree in args.degrees:
        if args.batch % degree or (args.hidden // 32) % degree:
            parser.error(f"--batch and the head count (hidden/32) must be divisible by the degree {degree}")

    print(
        f"torch {torch.__version__}; Llama hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}, "
        f"{args.hidden // 32} heads; global batch {args.batch}x{args.seq}, fp32, gloo, 1 thread per rank; "
        f"{args.steps} interleaved steps per copy after {args.warmup} warm-up"
    )
    for degree in args.degrees:
        results = mp.get_context("spawn").SimpleQueue()
        mp.start_processes(
            worker, args=(degree, common.free_port(), args, results), nprocs=degree, join=True, start_method="spawn"
        )
        print_report(degree, results.get())


def print_report(degree: int, report: dict[str, Any]) -> None:
    """One degree's table: each copy's median step time and bytes sent per step, both against torch's."""
    reference = statistics.median(report["times"]["torch DTensor TP"])
    torch_bytes = sum(report["sent"]["torch DTensor TP"][0].values())
    print(f"\ntensor-parallel degree {degree} ({degree} processes)")
    print(f"{'copy':<18}{'step ms':>10}{'/torch':>8}{'MB sent':>10}{'/torch':>8}{'first loss':>13}  bytes by group")
    for name, times in report["times"].items():
        ms = statistics.median(times) * 1e3
        by_group, counts = report["sent"][name]
        total = sum(by_group.values())
        groups = ", ".join(f"{k} {v / 1e6:.2f}" for k, v in sorted(by_group.items()))
        print(
            f"{name:<18}{ms:>10.1f}{ms / (reference * 1e3):>8.2f}{total / 1e6:>10.2f}"
            f"{total / torch_bytes:>8.2f}{report['first_loss'][name]:>13.6f}  {groups}"
        )
        if counts:
            print(f"{'':<18}torch collectives per step (CommDebugMode): {counts}")


if __name__ == "__main__":
    main()
