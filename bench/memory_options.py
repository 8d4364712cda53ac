"""Memory per rank of each memory option, side by side: activation offload, activation checkpointing, ZeRO 2 with and
without optimizer offload, a 2-stage pipeline, and their combinations.

    python bench/memory_options.py --json bench/results/memory_options_offload.json

One random Llama (default 8 layers, hidden 256, 4 heads, MLP 1024, vocabulary 2048, fp32), one global batch of 8
sequences of 256 tokens per step for every option (data=2 gives each rank 4 of them; pipe=2 runs them as M
micro-batches through two stages of 4 layers). Each step is `goldfish train`'s: the chunked token loss
(engine.core.vocab_parallel; the last stage's `Pipeline.step_token_losses` under pipe=2), summed, backward, gradient
sync and clipping, AdamW. Per rank (the largest), at the step's peak:

- parameters, gradients and AdamW moments: counted from the tensors after the update (engine.memory.zero.local
  chunks under ZeRO; with optimizer offload all three live in host memory, FSDP2's CPUOffloadPolicy);
- saved activations: the bytes of the tensors autograd keeps for backward, counted by saved-tensor hooks
  (engine.memory.offload: SavedActivations, or ActivationOffload for the offloaded rows, whose device figure is then
  what backward copies back at once). Transients are not in it: the layer being recomputed under checkpointing, a
  loss chunk's logits, ZeRO's gathered parameters (ZeRO 2 keeps every layer's full parameters from forward to
  backward, ZeRO 3 one layer's and the root's);
- the step's median seconds over `--steps` steps after a first untimed one (which builds the AdamW state); the
  one-process rows are also timed with offload copying into a separate host buffer (host_copy=True), the memory
  traffic an accelerator's device-to-host copy would make.

On a CPU, host memory is device memory: offload moves nothing (unless host_copy) and the figures are what a GPU run
of the same step would hold on the device and in host memory. With `--device cuda` the one-process rows also record
torch.cuda.max_memory_allocated of the step.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from queue import Empty

import common
import torch
import torch.multiprocessing as mp

import engine
from conventions import IGNORE_INDEX
from engine.core.vocab_parallel import causal_lm_token_losses
from engine.memory.activation import checkpoint_decoder_layers
from engine.memory.offload import ActivationOffload, SavedActivations
from engine.memory.zero import ZeroConfig, is_dtensor, local, make_adamw, shard_data_axis
from engine.training.pipeline import Pipeline


@dataclass(frozen=True)
class Case:
    """One option set. data / pipe: the grid (world = data * pipe); zero: ZeRO stage over data; offload_optimizer:
    FSDP2's CPUOffloadPolicy; host_copy: activation offload copies into a separate host buffer even on a CPU."""

    name: str
    data: int = 1
    pipe: int = 1
    zero: int = 0
    offload_optimizer: bool = False
    checkpointing: bool = False
    offload_activations: bool = False
    host_copy: bool = False
    schedule: str = "1f1b"

    @property
    def world(self) -> int:
        return self.data * self.pipe


CASES = (
    Case("baseline"),
    Case("offload activations", offload_activations=True),
    Case("offload activations, host copy", offload_activations=True, host_copy=True),
    Case("activation checkpointing", checkpointing=True),
    Case("checkpointing + offload activations", checkpointing=True, offload_activations=True),
    Case("ZeRO 2, data=2", data=2, zero=2),
    Case("ZeRO 2 + offload optimizer", data=2, zero=2, offload_optimizer=True),
    Case("ZeRO 2 + offload optimizer + offload activations", data=2, zero=2, offload_optimizer=True,
         offload_activations=True),
    Case("ZeRO 2 + offload both + checkpointing", data=2, zero=2, offload_optimizer=True, offload_activations=True,
         checkpointing=True),
    Case("pipe=2, GPipe", pipe=2, schedule="gpipe"),
    Case("pipe=2, 1F1B", pipe=2),
    Case("pipe=2, 1F1B + offload activations", pipe=2, offload_activations=True),
)  # fmt: skip


def _targets(rows: torch.Tensor) -> torch.Tensor:
    """Next-token targets of (B, T) ids: shifted left, IGNORE_INDEX at the last position."""
    targets = torch.full_like(rows, IGNORE_INDEX)
    targets[:, :-1] = rows[:, 1:]
    return targets


def _held(params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes of this rank's parameters, gradients and AdamW moments (local chunks of DTensors)."""
    out = {"params": 0, "grads": 0, "optimizer": 0}
    for p in params:
        out["params"] += local(p).numel() * p.element_size()
        if p.grad is not None:
            out["grads"] += local(p.grad).numel() * p.grad.element_size()
        for value in optimizer.state.get(p, {}).values():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                out["optimizer"] += local(value).numel() * value.element_size()
    return out


def _run_case(case: Case, args: argparse.Namespace, rank: int, device: torch.device) -> dict:
    """Build, run `args.steps + 1` steps of `case` on this rank; its figures from the last step."""
    grid = engine.init(data=case.data, pipe=case.pipe)
    model = common.build_llama(**common.model_shape(args)).to(device)
    if case.checkpointing:
        checkpoint_decoder_layers(model)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=torch.Generator().manual_seed(1)).to(device)
    pipe = None
    if case.pipe > 1:
        pipe = Pipeline(model, grid.group("pipe"), schedule=case.schedule, microbatches=args.microbatches)
        params = pipe.parameters()
        optimizer: torch.optim.Optimizer = torch.optim.AdamW(params, lr=1e-4)
    elif case.zero:
        zero = ZeroConfig(case.zero, offload=case.offload_optimizer)
        model = shard_data_axis(engine.parallelize(model, grid), grid, zero)
        params = list(model.parameters())
        optimizer = make_adamw(model, [{"params": params}], lr=1e-4)
        ids = ids[grid.coord("data") :: case.data]  # this data rank's rows of the global batch
    else:
        params = list(model.parameters())
        optimizer = torch.optim.AdamW(params, lr=1e-4)
    if case.offload_activations:
        block: ActivationOffload | SavedActivations = ActivationOffload(True, device, host_copy=case.host_copy)
    else:
        block = SavedActivations(device)
    targets = _targets(ids)
    seconds, cuda_peak, gathered = [], None, 0
    for step in range(args.steps + 1):
        block.reset(model.parameters())  # placed parameters stay in place (ActivationOffload.reset)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        started = time.perf_counter()
        with block:
            if pipe is not None:
                pipe.step_token_losses(ids, targets, lambda losses, rows: losses.sum())
            else:
                loss = causal_lm_token_losses(model, ids, targets).sum()
                if case.zero:  # forward done, backward not begun: the gathered (unsharded) parameters FSDP holds
                    gathered = sum(p.untyped_storage().nbytes() for p in model.parameters() if not is_dtensor(p))
                loss.backward()
        if pipe is None:
            engine.sync_gradients(model, grid)
            engine.clip_grad_norm_(model, 1.0, grid)
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            cuda_peak = torch.cuda.max_memory_allocated(device)
        if step:
            seconds.append(time.perf_counter() - started)
        held = _held(params, optimizer)
        optimizer.zero_grad(set_to_none=True)
    grid.close()
    stats = block.stats
    return {
        "rank": rank,
        "rows": int(ids.shape[0]),
        **held,
        "gathered_bytes": gathered,
        "saved_peak_bytes": stats.saved_peak_bytes,
        "device_saved_peak_bytes": stats.device_peak_bytes,
        "host_saved_peak_bytes": stats.host_peak_bytes,
        "offloaded_bytes": stats.offloaded_bytes,
        "restored_bytes": stats.restored_bytes,
        "step_s": statistics.median(seconds),
        "cuda_peak_bytes": cuda_peak,
    }


TIMED = ("no hooks", "counting only", "offload", "offload, host copy")


def _time_offload(args: argparse.Namespace, device: torch.device) -> dict[str, dict[str, float]]:
    """Seconds of one training step (chunked loss, backward, AdamW) of the one-process model per mode of TIMED: the
    fastest and the median of `args.rounds` rounds, the modes interleaved (machine drift hits all alike), after one
    untimed round. On a shared machine the fastest is the least disturbed."""
    model = common.build_llama(**common.model_shape(args)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=torch.Generator().manual_seed(1)).to(device)
    targets = _targets(ids)
    blocks = {
        "no hooks": ActivationOffload(False, device),
        "counting only": SavedActivations(device),
        "offload": ActivationOffload(True, device),
        "offload, host copy": ActivationOffload(True, device, host_copy=True),
    }

    def step(block) -> None:
        with block:
            causal_lm_token_losses(model, ids, targets).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    seconds: dict[str, list[float]] = {name: [] for name in TIMED}
    for round_ in range(args.rounds + 1):
        for name in TIMED:
            _, took = common.timed(lambda: step(blocks[name]), device)
            if round_:
                seconds[name].append(took)
    return {name: {"min": min(values), "median": statistics.median(values)} for name, values in seconds.items()}


def _worker(rank: int, world: int, port: int, cases: list[Case], args: argparse.Namespace, queue) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank)
    )
    device = torch.device(args.device if world == 1 else "cpu")
    for case in cases:
        queue.put((case.name, _run_case(case, args, rank, device)))
    if world == 1 and args.rounds:
        queue.put(("timing", _time_offload(args, device)))


def _run_world(world: int, cases: list[Case], args: argparse.Namespace) -> dict[str, list[dict]]:
    """Every case of this world size on `world` spawned processes (one gloo world, grids built per case)."""
    port, context = common.free_port(), mp.get_context("spawn")
    queue = context.Queue()
    procs = [context.Process(target=_worker, args=(r, world, port, cases, args, queue)) for r in range(world)]
    for p in procs:
        p.start()
    out: dict[str, list[dict]] = {}
    received, expected = 0, world * len(cases) + (world == 1 and args.rounds > 0)
    while received < expected:
        try:
            name, figures = queue.get(timeout=5)
        except Empty:
            if any(p.exitcode not in (None, 0) for p in procs):  # a rank died: its peers would wait forever
                for p in procs:
                    p.kill()
                raise SystemExit(f"a rank of the world-{world} run failed (its traceback is above)") from None
            continue
        out.setdefault(name, []).append(figures)
        received += 1
    for p in procs:
        p.join()
    return out


def _row(case: Case, per_rank: list[dict]) -> dict:
    """The largest rank's figures, split into what lives on the device and what in host memory."""
    state = ("params", "grads", "optimizer")
    worst = max(per_rank, key=lambda r: sum(r[k] for k in state) + r["saved_peak_bytes"])
    on_host = case.offload_optimizer  # FSDP2's CPUOffloadPolicy keeps all three in host memory
    device = (0 if on_host else sum(worst[k] for k in state)) + worst["gathered_bytes"]
    device += worst["device_saved_peak_bytes"]
    host = (sum(worst[k] for k in state) if on_host else 0) + worst["host_saved_peak_bytes"]
    return {"case": asdict(case), "per_rank": per_rank, "worst_rank": worst["rank"], "device_bytes": device,
            "host_bytes": host, "step_s": max(r["step_s"] for r in per_rank)}  # fmt: skip


def _machine() -> dict:
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "")
    # the cores this process may run on (`nproc` would answer OMP_NUM_THREADS when it is set)
    return {"cpu": model or platform.processor(), "nproc": len(os.sched_getaffinity(0)), "torch": torch.__version__}


def _print(rows: list[dict], timing: dict[str, dict[str, float]] | None) -> None:
    mib = 2**20
    base = rows[0]
    print(
        "| option | rows / rank | params | grads | AdamW | gathered params | saved activations: on device / without "
        "offload | in host memory | device total | x baseline | step s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        w = next(r for r in row["per_rank"] if r["rank"] == row["worst_rank"])
        where = " (host)" if row["case"]["offload_optimizer"] else ""
        print(
            f"| {row['case']['name']} | {w['rows']} | {w['params'] / mib:.2f}{where} | {w['grads'] / mib:.2f}{where} "
            f"| {w['optimizer'] / mib:.2f}{where} | {w['gathered_bytes'] / mib:.2f} "
            f"| {w['device_saved_peak_bytes'] / mib:.2f} / {w['saved_peak_bytes'] / mib:.2f} "
            f"| {row['host_bytes'] / mib:.2f} | {row['device_bytes'] / mib:.2f} "
            f"| {row['device_bytes'] / base['device_bytes']:.2f} | {row['step_s']:.2f} |"
        )
    if timing:
        print("\n| one process, step with | fastest s | x no hooks | median s | x no hooks |\n|---|---|---|---|---|")
        base = timing["no hooks"]
        for name, took in timing.items():
            print(
                f"| {name} | {took['min']:.3f} | {took['min'] / base['min']:.3f} | {took['median']:.3f} "
                f"| {took['median'] / base['median']:.3f} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_options(parser, vocab=2048, hidden=256, layers=8, heads=4, intermediate=1024, seq=256, steps=3, rounds=7)
    common.add_options(parser, device="cpu", json=None)
    parser.add_argument("--batch", type=int, default=8, help="sequences per step (global batch)")
    parser.add_argument("--microbatches", type=int, default=4, help="pipeline micro-batches per step (pipe=2 rows)")
    parser.add_argument("--only", nargs="*", help="run only the options whose name contains one of these")
    args = common.parse(parser)
    cases = [c for c in CASES if not args.only or any(o in c.name for o in args.only)]
    results: dict[str, list[dict]] = {}
    for world in sorted({c.world for c in cases}):
        results.update(_run_world(world, [c for c in cases if c.world == world], args))
    timing = results.pop("timing", [None])[0]
    rows = [_row(c, results[c.name]) for c in cases]
    _print(rows, timing)
    if args.json:
        shape = {k: getattr(args, k) for k in ("vocab", "hidden", "layers", "heads", "intermediate", "seq", "batch")}
        result = {"machine": _machine(), "model": shape, "steps": args.steps, "microbatches": args.microbatches}
        common.write_result(args.json, {**result, "rows": rows, "timing_s": timing})


if __name__ == "__main__":
    main()
