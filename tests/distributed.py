"""Run a function in N gloo processes and bring back each rank's result or traceback.

    results = run_distributed(4, worker, arg1, arg2)   # worker(arg1, arg2) runs on ranks 0..3

Each worker process joins a fresh gloo world through a file rendezvous in a temporary directory, uses one
thread, and always destroys its process group. A failing rank's exception comes back to the test with its
traceback (all failing ranks are listed). `worker` must be a module-level function (it is pickled).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import tempfile
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable

import torch
import torch.distributed as dist

# Imported once in the fork server that every worker is forked from (missing ones are skipped): workers
# then start without paying for these imports, which dominate a small test on a 2-core machine.
PRELOAD = (
    "torch",
    "torch.distributed",
    "transformers.modeling_utils",
    "transformers.models.llama.modeling_llama",
    "transformers.models.gpt2.modeling_gpt2",
)


WORKER_THREADS = 1  # torch threads per worker: one, so that ranks sharing 2 cores do not oversubscribe them


@contextmanager
def worker_threads() -> Iterator[None]:
    """Inside: this process runs torch on the workers' thread count, so a serial reference computed here reduces
    its sums in the workers' order (a bit-for-bit comparison needs it at any OMP_NUM_THREADS). Restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(WORKER_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class RankFailure(AssertionError):
    """One or more ranks raised; the message holds every failing rank's traceback."""


def _worker(
    rank: int, world_size: int, init_file: str, results: Any, fn: Callable[..., Any], args: tuple[Any, ...]
) -> None:
    torch.set_num_threads(WORKER_THREADS)
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
        try:
            results.put((rank, True, fn(*args)))
        finally:
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - every failure must reach the test
        results.put((rank, False, traceback.format_exc()))


def run_distributed(world_size: int, fn: Callable[..., Any], *args: Any, timeout: float = 300.0) -> list[Any]:
    """Run `fn(*args)` on `world_size` gloo ranks; return the results in rank order or raise RankFailure."""
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOAD))
    results = context.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [
            context.Process(target=_worker, args=(r, world_size, init_file, results, fn, args), daemon=True)
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        outcomes: dict[int, tuple[bool, Any]] = {}
        try:
            while len(outcomes) < world_size:
                try:
                    rank, ok, payload = results.get(timeout=timeout)
                except queue.Empty:
                    if any(not ok for ok, _ in outcomes.values()):
                        break
                    raise RankFailure(
                        f"ranks {sorted(set(range(world_size)) - set(outcomes))} gave no result "
                        f"within {timeout:.0f} s (deadlock or crash)"
                    ) from None
                outcomes[rank] = (ok, payload)
                if not ok:  # a failed rank leaves its peers blocked in collectives: give them 2 s, then stop
                    timeout = 2.0
        finally:
            for p in procs:
                p.join(timeout=5 if len(outcomes) == world_size else 0.5)
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join()
    failures = {r: payload for r, (ok, payload) in outcomes.items() if not ok}
    if failures:
        raise RankFailure("\n".join(f"--- rank {r} ---\n{tb}" for r, tb in sorted(failures.items())))
    return [outcomes[r][1] for r in range(world_size)]
