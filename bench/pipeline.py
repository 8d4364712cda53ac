"""Pipeline schedules on gloo: each rank's measured bubble and bytes sent beside the models', side by side in one run.

    python bench/pipeline.py --world 4 --microbatches 8 --json bench/results/pipeline_world4.json

Every rank (a gloo process with one thread) builds the same random Llama, cuts it into P = --world stages (V =
--virtual stages per rank for the interleaved schedules) with engine.training.pipeline.Pipeline and trains
--steps steps (after --warmup) of --rows sequences in M = --microbatches micro-batches under each schedule in turn,
repeated --rounds times, interleaved so that drift of a shared machine hits all schedules alike.

Measured, per rank and step (the median over rounds of the mean over steps):
- bubble: 1 - compute / step, where compute is the wall-clock seconds spent inside the rank's stage forward,
  backward (input and weight) and loss calls (timed inside torch's PipelineStage, so waits for neighbours are
  excluded) and step is the slowest rank's time from a common start (a barrier) to the end of the step;
- bytes: the tensors of the rank's point-to-point sends (activations forward, their gradients backward).

Models, for stages of equal cost and a backward costing twice the forward:
- GPipe and 1F1B: (P-1) / (M+P-1);  interleaved 1F1B: (P-1) / (V*M+P-1);
- zero bubble (torch's ScheduleInterleavedZeroBubble, ZB-H1 of Qi et al. 2024): the weight-gradient third of each
  backward fills the cool-down, leaving a third of the interleaved bubble: (P-1) / (3*V*M+P-1);
- bytes per rank: M micro-batches x (B/M x T x H x 4 bytes) for each of its stages that is not the last (forward)
  plus each that is not the first (backward).
Two more columns run the schedules' own action lists (the order torch executes F, B, I, W on each rank) through a
small simulation with those costs and free messages: on P cores it gives the schedule's exact bubble for equal stages
(it equals the closed forms above), and on this machine's cores, shared equally among the ranks computing at each
moment, the bubble to expect where ranks outnumber cores.

The first stage also holds the embeddings and the last one the final norm, lm_head and loss, so stages are not of
exactly equal cost; a small vocabulary (--vocab) keeps the lm_head light. On a machine with fewer cores than ranks
the ranks share cores, which stretches the busy phases of the steady state.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import traceback
from typing import Any

import common
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F

import engine
from engine.core import comm
from engine.planner.cost_model import pipeline_bubble  # the planner's closed forms (see the module docstring)
from engine.training.pipeline import SCHEDULES, Pipeline


def model_bytes(rank: int, p: int, v: int, m: int, rows: int, seq: int, hidden: int) -> int:
    """Bytes rank `rank` sends per step: each micro-batch's float32 hidden states (rows/m, seq, hidden) forward
    from each of its stages but the last, and their gradient backward from each but the first."""
    stages = [rank + p * i for i in range(v)]
    crossings = sum(s != p * v - 1 for s in stages) + sum(s != 0 for s in stages)
    return crossings * m * (rows // m) * seq * hidden * 4


def action_lists(schedule: str, pipe: Pipeline, p: int, m: int) -> dict[int, list[tuple[str, int, int]]]:
    """rank -> its compute actions (kind F, B, I or W; stage; micro-batch) in the order the schedule runs them: the
    runtime's own lists for the interleaved schedules, the loops of ScheduleGPipe and Schedule1F1B for the others
    (P - r forwards first on rank r, then alternating a backward and a forward)."""
    if SCHEDULES[schedule][1]:
        return {
            r: [(a.computation_type.value, a.stage_index, a.microbatch_index) for a in acts if a is not None]
            for r, acts in pipe.schedule.pipeline_order.items()
        }
    lists = {}
    for r in range(p):
        warmup = m if schedule == "gpipe" else min(m, p - r)
        forwards, backwards = [("F", r, i) for i in range(m)], [("B", r, i) for i in range(m)]
        steady = [a for pair in zip(backwards, forwards[warmup:]) for a in pair]
        lists[r] = forwards[:warmup] + steady + backwards[len(steady) // 2 :]
    return lists


def simulated_bubble(lists: dict[int, list[tuple[str, int, int]]], n_stages: int, v: int, cores: int) -> list[float]:
    """Each rank's idle share when the ranks run their action lists on `cores` cores shared equally among the ranks
    computing at each moment, with a forward costing 1/V, a full backward 2/V and an input or weight backward 1/V
    each, and messages free. On P cores this is the schedule's bubble for equal stages; on fewer, the ranks' compute
    stretches as they share cores."""
    cost = {"F": 1 / v, "B": 2 / v, "I": 1 / v, "W": 1 / v}
    todo = {r: [a for a in acts if a[0] in cost] for r, acts in lists.items()}
    done: set[tuple[str, int, int]] = set()
    left: dict[int, float] = {}
    busy, now = dict.fromkeys(todo, 0.0), 0.0

    def ready(kind: str, stage: int, mb: int) -> bool:
        if kind == "F":
            return stage == 0 or ("F", stage - 1, mb) in done
        if kind == "W":
            return ("I", stage, mb) in done
        if stage == n_stages - 1:
            return ("F", stage, mb) in done
        return ("B", stage + 1, mb) in done or ("I", stage + 1, mb) in done

    while any(todo.values()):
        for r, acts in todo.items():
            if r not in left and acts and ready(*acts[0]):
                left[r] = cost[acts[0][0]]
        if not left:
            raise RuntimeError(f"the action lists deadlock at {[acts[:1] for acts in todo.values()]}")
        rate = min(1.0, cores / len(left))
        step = min(left.values()) / rate
        now += step
        for r in list(left):
            busy[r] += step
            left[r] -= step * rate
            if left[r] < 1e-9:
                done.add(todo[r].pop(0))
                del left[r]
    return [1 - busy[r] / now for r in sorted(busy)]


def loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="sum")


def _virtual(schedule: str, args: argparse.Namespace) -> int:
    return args.virtual if SCHEDULES[schedule][1] else 1


def _worker(rank: int, args: argparse.Namespace, port: int, queue: Any) -> None:
    torch.set_num_threads(args.threads or 1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(args.world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    grid = engine.init(data=args.world, backend="gloo")
    group = grid.group("data")
    try:
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(0, args.vocab, (args.rows, args.seq), generator=generator)
        labels = torch.roll(ids, -1, dims=1)
        pipes = {}
        for schedule in args.schedules:
            model = common.build_llama(**common.model_shape(args), heads=args.hidden // 64)
            pipe = Pipeline(
                model,
                group,
                loss_fn=loss_sum,
                schedule=schedule,
                microbatches=args.microbatches,
                virtual=_virtual(schedule, args),
            )
            for _ in range(args.warmup):
                pipe.step(ids, labels)
            pipes[schedule] = pipe
        rounds: dict[str, list[tuple[float, float, float]]] = {s: [] for s in args.schedules}
        for _ in range(args.rounds):
            for schedule, pipe in pipes.items():
                bubbles, steps, sent = [], [], []
                for _ in range(args.steps):
                    pipe.stats.reset()
                    comm.barrier(group)
                    started = time.perf_counter()
                    pipe.step(ids, labels)
                    elapsed = time.perf_counter() - started
                    slowest = max(comm.all_gather_objects(elapsed, group))
                    bubbles.append(1 - pipe.stats.compute_s / slowest)
                    steps.append(slowest)
                    sent.append(pipe.stats.sent_bytes)
                    for p in pipe.parameters():
                        p.grad = None
                rounds[schedule].append((statistics.mean(bubbles), statistics.mean(steps), statistics.mean(sent)))
        mine = {
            s: {k: statistics.median(r[i] for r in rounds[s]) for i, k in enumerate(("bubble", "step_s", "bytes"))}
            for s in args.schedules
        }
        everyone = comm.gather_objects(mine, group)
        if rank == 0:
            n_cores = os.cpu_count() or 1
            for schedule, pipe in pipes.items():
                lists, v = action_lists(schedule, pipe, args.world, args.microbatches), _virtual(schedule, args)
                everyone[0][schedule]["order_p_cores"] = simulated_bubble(lists, args.world * v, v, args.world)
                everyone[0][schedule]["order_machine"] = simulated_bubble(lists, args.world * v, v, n_cores)
            queue.put(everyone)
    except BaseException:  # noqa: BLE001 - the parent must hear of it rather than wait for rank 0
        queue.put(f"rank {rank} failed:\n{traceback.format_exc()}")
        raise
    finally:
        grid.close(destroy_world=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=4, help="ranks = pipeline stages P (default: %(default)s)")
    parser.add_argument("--microbatches", type=int, default=8, help="micro-batches M per step (default: %(default)s)")
    parser.add_argument("--virtual", type=int, default=2, help="stages per rank V, interleaved (default: %(default)s)")
    parser.add_argument("--rows", type=int, default=32, help="sequences per step B (default: %(default)s)")
    parser.add_argument("--schedules", nargs="+", default=list(SCHEDULES), choices=list(SCHEDULES))
    common.add_options(
        parser, vocab=512, hidden=256, layers=8, seq=256, steps=2, warmup=1, rounds=2, threads=1, json=None
    )
    args = common.parse(parser)
    context = mp.get_context("spawn")
    queue = context.Queue()
    port = common.free_port()
    procs = [context.Process(target=_worker, args=(r, args, port, queue)) for r in range(args.world)]
    for p in procs:
        p.start()
    everyone = queue.get(timeout=3600)
    for p in procs:
        p.join(timeout=None if not isinstance(everyone, str) else 5)
        if p.is_alive():
            p.kill()
    if isinstance(everyone, str):
        raise SystemExit(everyone)
    p_, m = args.world, args.microbatches
    print(f"{p_} gloo ranks, {os.cpu_count()} cores; Llama {args.layers} layers x {args.hidden}, vocab {args.vocab}")
    print(f"B={args.rows} sequences of {args.seq} tokens in M={m} micro-batches per step")
    header = (
        "schedule",
        "V",
        "step s",
        "bubble: model",
        f"torch's order, {p_} cores",
        f"on {os.cpu_count()} cores",
        "measured (mean)",
        "measured per rank",
        "KiB sent per rank: model",
        "measured",
    )
    print(" | ".join(header))
    results = {}
    for schedule in args.schedules:
        v = _virtual(schedule, args)
        bubbles = [everyone[r][schedule]["bubble"] for r in range(p_)]
        sent = [everyone[r][schedule]["bytes"] for r in range(p_)]
        expected = [model_bytes(r, p_, v, m, args.rows, args.seq, args.hidden) for r in range(p_)]
        results[schedule] = {
            "virtual": v,
            "step_s": max(everyone[r][schedule]["step_s"] for r in range(p_)),
            "bubble_model": pipeline_bubble(schedule, p_, m, v),
            "bubble_order_p_cores": statistics.mean(everyone[0][schedule]["order_p_cores"]),
            "bubble_order_machine": statistics.mean(everyone[0][schedule]["order_machine"]),
            "bubble_measured": statistics.mean(bubbles),
            "bubble_per_rank": bubbles,
            "bytes_model_per_rank": expected,
            "bytes_measured_per_rank": sent,
        }
        r = results[schedule]
        print(
            f"{schedule} | {v} | {r['step_s']:.2f} | {r['bubble_model']:.1%} | {r['bubble_order_p_cores']:.1%} | "
            f"{r['bubble_order_machine']:.1%} | {r['bubble_measured']:.1%} | "
            + " ".join(f"{b:.1%}" for b in bubbles)
            + f" | {'/'.join(str(e // 1024) for e in expected)} | {'/'.join(str(int(s) // 1024) for s in sent)}"
        )
    if args.json:
        print(f"wrote {common.write_result(args.json, {'settings': vars(args), 'results': results})}")


if __name__ == "__main__":
    main()
