"""Step time with a checkpoint every few steps: blocking saves beside asynchronous ones (`--async-save`), one run.

    python bench/async_save.py --world 2 --grid data=2 --steps 12 --save-every 3 --json bench/results/async_save.json

Every rank (gloo processes on this machine) builds the same random Llama, parallelizes it for `--grid` and trains
with AdamW; every `--save-every` steps it writes a checkpoint of the weights and the AdamW state through DCP
(engine.training.checkpoint), first blocking (save_checkpoint: the step waits until the files are written and
published) and then asynchronous (AsyncSaver: the step waits only for the CPU copy of its chunks; the write and
the publication run in a background thread, and the next save waits for the previous one). Both modes train the
same steps from the same weights and write into the same folder (a fresh one per mode, under --dir). A step's time
is the slowest rank's, including the save it triggers; the run's time ends when the last checkpoint is published.
Reported per mode: the mean step time over all steps, over the steps that saved and over the others, the wait for
the last checkpoint at the end, and the total; the ratio is blocking total / asynchronous total.

On a CPU machine the background write shares the cores with the training, so the overlap is partial; on a GPU
node the step runs on the device and the write on the host.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import common
import torch
import torch.multiprocessing as mp

import engine
from engine.core.grid import GridShape
from engine.spec import parse_grid_sizes as parse_grid
from engine.training.checkpoint import AsyncSaver, save_checkpoint

MODES = ("blocking", "async")


def _run_mode(mode: str, model, optimizer, ids, grid, args, folder: Path) -> dict[str, float]:
    """Train args.steps steps saving every args.save_every; the slowest rank's seconds of each."""
    saver = AsyncSaver(grid) if mode == "async" else None
    steps, saved = [], []
    started = time.perf_counter()
    for step in range(1, args.steps + 1):

        def one_step() -> None:
            common.train_step(model, optimizer, ids, grid)
            if step % args.save_every == 0:
                extra = {"step": step}
                if saver is not None:
                    saver.save(folder / "checkpoint", model, optimizer, extra_state=extra)
                else:
                    save_checkpoint(folder / "checkpoint", model, optimizer, grid, extra_state=extra)

        _, seconds = common.slowest_rank_seconds(one_step)
        steps.append(seconds)
        saved.append(step % args.save_every == 0)
    _, wait = common.slowest_rank_seconds(lambda: saver.close() if saver is not None else None)
    total = time.perf_counter() - started
    return {
        "step_s": statistics.mean(steps),
        "saving_step_s": statistics.mean(s for s, k in zip(steps, saved) if k),
        "other_step_s": statistics.mean(s for s, k in zip(steps, saved) if not k),
        "final_wait_s": wait,
        "total_s": total,
    }


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, queue) -> None:
    torch.set_num_threads(args.threads or 1)
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank)
    )
    grid = engine.init(**parse_grid(args.grid))
    try:
        ids = torch.randint(0, args.vocab, (args.rows, args.seq), generator=torch.Generator().manual_seed(rank))
        trained = {}
        for mode in MODES:  # the same weights and rows for both modes
            model = engine.parallelize(common.build_llama(**common.model_shape(args), heads=args.hidden // 64), grid)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            for _ in range(max(args.warmup, 1)):  # the first builds AdamW's state: every save holds it
                common.train_step(model, optimizer, ids, grid)
            trained[mode] = (model, optimizer)
        rounds: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
        for number in range(args.rounds):  # interleaved: drift of a shared machine hits both modes alike
            for mode in MODES:
                folder = Path(args.dir) / f"{mode}-{number}"
                rounds[mode].append(_run_mode(mode, *trained[mode], ids, grid, args, folder))
                checkpoint_bytes = sum(f.stat().st_size for f in (folder / "checkpoint").rglob("*") if f.is_file())
                rounds[mode][-1]["checkpoint_mb"] = checkpoint_bytes / 2**20
        results = {mode: {k: statistics.median(r[k] for r in rounds[mode]) for k in rounds[mode][0]} for mode in MODES}
        if rank == 0:
            queue.put(results)
    finally:
        grid.close(destroy_world=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2, help="processes (default: %(default)s)")
    parser.add_argument("--grid", default="data=2", help="grid of the processes (default: %(default)s)")
    parser.add_argument("--save-every", type=int, default=3, help="steps between checkpoints (default: %(default)s)")
    parser.add_argument("--rows", type=int, default=2, help="sequences per rank and step (default: %(default)s)")
    parser.add_argument("--dir", default=None, help="where the checkpoints go (default: a temporary folder)")
    common.add_options(
        parser, vocab=8192, hidden=512, layers=4, seq=128, steps=12, warmup=2, rounds=2, threads=1, json=None
    )
    args = common.parse(parser)
    if GridShape(**parse_grid(args.grid)).world_size != args.world:
        parser.error(f"--grid {args.grid} does not have --world {args.world} ranks")
    if args.steps < 2 * args.save_every:
        parser.error("--steps must be at least twice --save-every (steps with and without a save)")
    own_dir = args.dir is None
    args.dir = args.dir or tempfile.mkdtemp(prefix="async-save-")
    try:
        context = mp.get_context("spawn")
        queue = context.Queue()
        port = common.free_port()
        procs = [context.Process(target=_worker, args=(r, args.world, port, args, queue)) for r in range(args.world)]
        for p in procs:
            p.start()
        results = queue.get(timeout=3600)
        for p in procs:
            p.join()
    finally:
        if own_dir:
            shutil.rmtree(args.dir, ignore_errors=True)
    print(f"{args.world} gloo processes, grid {args.grid}, {args.steps} steps, a checkpoint every {args.save_every}")
    print(f"checkpoint: {results['blocking']['checkpoint_mb']:.0f} MiB (weights + AdamW state, DCP)")
    header = ("mode", "step s", "saving step s", "other step s", "final wait s", "total s")
    print("".join(f"{h:>15}" for h in header))
    for mode in MODES:
        r = results[mode]
        row = (r["step_s"], r["saving_step_s"], r["other_step_s"], r["final_wait_s"], r["total_s"])
        print(f"{mode:>15}" + "".join(f"{v:>15.3f}" for v in row))
    ratio = results["blocking"]["total_s"] / results["async"]["total_s"]
    print(f"blocking / async total time: {ratio:.2f}")
    if args.json:
        written = common.write_result(args.json, {"settings": vars(args), "results": results, "ratio": ratio})
        print(f"wrote {written}")


if __name__ == "__main__":
    main()
