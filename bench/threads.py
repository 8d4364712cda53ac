"""Benchmark: the quick start's training step at the default thread count, at 1 and 2 threads, quiet and under load.

Each contender is the `goldfish train` command itself on the embedded corpus (tiny-llama, the quick start's model),
run in a subprocess for `--epochs` epochs; its step time is the median of metrics.jsonl's steps after the first
(batch tokens / tokens_per_s). The contenders:
  * default: no --threads, as a user runs it (the cores free now, OpenMP's passive wait; the line it prints is shown);
  * 1 and 2: --threads 1, --threads 2 (passive wait, set by the command's entry point);
  * old-default: what the command did before it counted free cores: torch's choice (one thread per usable core) and
    OpenMP's default wait policy (idle threads spin a while), run past the entry point.
Each condition runs the contenders in interleaved rounds (a change of machine load falls on all alike): first quiet
(whatever else runs on the machine: the load average is printed), then under a CPU-bound load the bench starts itself,
`--load-procs` busy-loop processes, each bounded by `--load-seconds` and always stopped at the end (Ctrl-C too).
Exit status 0 when, under the load, the default's step time is within 1.5x of the best contender's.

    python bench/threads.py                              # tiny-llama, 3 epochs (12 steps), 2 rounds
    python bench/threads.py --json bench/results/threads_cpu.json
    python bench/threads.py --model micro-llama --epochs 1 --rounds 1   # seconds: the test's size
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common

ROOT = Path(__file__).resolve().parents[1]
DONE_RATIO = 1.5  # the default's step time under load, at most this many times the best contender's
# The command before it chose threads: past the entry point (no OMP_WAIT_POLICY), torch's one thread per core.
_OLD_ENTRY = "import sys; from goldfish.app.cli import main; sys.exit(main(sys.argv[1:]))"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny-llama", help="goldfish train --model (the quick start's: tiny-llama)")
    p.add_argument("--epochs", type=int, default=3, help="epochs per run (4 steps each on the embedded corpus)")
    common.add_options(p, rounds=2)
    p.add_argument("--load-procs", type=int, default=None, help="busy-loop processes of the load (default: cores)")
    p.add_argument("--load-seconds", type=float, default=900.0, help="each busy loop stops after this long anyway")
    common.add_options(p, json=None)
    args = common.parse(p, argv)
    if args.epochs < 1:
        p.error(f"--epochs must be >= 1, got {args.epochs}")
    return args


def contenders(cores: int) -> dict[str, tuple[list[str], dict[str, str]]]:
    """name -> (interpreter arguments before the train options, environment additions)."""
    goldfish = ["-m", "goldfish", "train"]
    return {
        "default": (goldfish, {}),
        "1": ([*goldfish, "--threads", "1"], {}),
        "2": ([*goldfish, "--threads", "2"], {}),
        "old-default": (["-c", _OLD_ENTRY, "train", "--threads", str(cores)], {}),
    }


def run_train(prefix: list[str], extra_env: dict[str, str], args: argparse.Namespace, out: Path) -> tuple[float, str]:
    """One `goldfish train` run: (median step milliseconds after the first step, its `threads:` line)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")} | extra_env
    argv = [sys.executable, *prefix, "--out", str(out), "--overwrite", "--no-progress"]
    argv += ["--model", args.model, "--epochs", str(args.epochs)]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[-2000:]}")
    run = json.loads((out / "run.json").read_text())
    batch_tokens = run["train"]["batch_size"] * run["data"]["seq_len"]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rates = [r["tokens_per_s"] for r in records if "tokens_per_s" in r][1:]  # the first step pays first-call costs
    if not rates:
        raise RuntimeError(f"{out / 'metrics.jsonl'} has no step after the first: raise --epochs")
    line = next((x for x in done.stderr.splitlines() if x.startswith("threads:")), "")
    return 1000.0 * batch_tokens / statistics.median(rates), line


def start_load(procs: int, seconds: float) -> list[subprocess.Popen]:
    """`procs` CPU-bound processes, each ending by itself after `seconds`."""
    loop = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"
    return [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(procs)]


def stop_load(load: list[subprocess.Popen]) -> None:
    for proc in load:
        proc.kill()
    for proc in load:
        proc.wait()


def measure(args: argparse.Namespace, work: Path) -> dict:
    """Every contender, `args.rounds` interleaved rounds: per contender the median step ms over rounds."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    steps: dict[str, list[float]] = {}
    lines: list[str] = []
    for _ in range(args.rounds):
        for name, (prefix, env) in contenders(cores).items():
            ms, line = run_train(prefix, env, args, work / name)
            steps.setdefault(name, []).append(ms)
            if name == "default":
                lines.append(line)
    step_ms = {name: statistics.median(values) for name, values in steps.items()}
    best = min(step_ms.values())
    return {
        "step_ms": step_ms,
        "step_ms_rounds": steps,
        "default_vs_best": step_ms["default"] / best,
        "default_line": lines[-1],
        "default_lines": lines,
        "load_average_1min_at_end": os.getloadavg()[0],
    }


def print_condition(name: str, figures: dict, load_before: float) -> None:
    cells = "  ".join(f"{k}: {v:7.1f} ms" for k, v in figures["step_ms"].items())
    print(f"{name:<7} (load average before {load_before:.2f}, after {figures['load_average_1min_at_end']:.2f})")
    print(f"  step time  {cells}")
    print(f"  default / best: {figures['default_vs_best']:.2f}x   default said: {figures['default_line']}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    procs = cores if args.load_procs is None else args.load_procs
    figures: dict = {"model": args.model, "epochs": args.epochs, "rounds": args.rounds, "cores": cores}
    print(f"goldfish train --model {args.model} --epochs {args.epochs}: median step time, {args.rounds} rounds")
    with tempfile.TemporaryDirectory(prefix="goldfish-threads-") as tmp:
        before = os.getloadavg()[0]
        figures["quiet"] = measure(args, Path(tmp))
        print_condition("quiet", figures["quiet"], before)
        load = start_load(procs, args.load_seconds)
        try:
            time.sleep(1.0)  # the busy loops running before the first contender counts free cores
            before = os.getloadavg()[0]
            figures["loaded"] = measure(args, Path(tmp))
        finally:
            stop_load(load)
        figures["loaded"]["load_procs"] = procs
        print_condition("loaded", figures["loaded"], before)
    figures["done"] = figures["loaded"]["default_vs_best"] <= DONE_RATIO
    print(f"under {procs} busy processes the default is within {DONE_RATIO}x of the best: {figures['done']}")
    if args.json:
        common.write_result(args.json, figures, argv)
    return 0 if figures["done"] else 1


if __name__ == "__main__":
    sys.exit(main())
