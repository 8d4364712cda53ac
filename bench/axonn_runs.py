"""The planner's predictions for the AxoNN paper's published runs, beside the published flop/s.

Paper: Singh et al., "Democratizing AI: Open-source Scalable LLM Training on GPU-based Supercomputers", SC'24,
arXiv 2502.08145. Published sustained bf16 flop/s: 620.1 Pflop/s on 4,096 A100s (Perlmutter), 1.381 Eflop/s on
32,768 MI250X GCDs (Frontier), 1.423 Eflop/s on 6,144 H100s (Alps); weak-scaling efficiency 88.3% on 8,192 GCDs
(Frontier) and 76.5% on 6,144 H100s (Alps).

Usage (no GPU needed: it only runs the planner; a few minutes on one core):

    python bench/axonn_runs.py --out bench/results/axonn_runs.json --plot bench/results/axonn_weak_scaling.png

For every run it plans the GPT model on that machine's profile (engine.planner.profiles) at `--compute-efficiency` and
takes the fastest grid (rows layout, ZeRO stage, activation checkpointing and micro-batches as the planner picks them:
options of `goldfish train`). Sustained flop/s = model FLOPs of the step
(engine.planner.cost_model.model_flops_per_token: 6 x matmul
weights + attention, no recomputation) / predicted step time.

Assumptions, stated because the published figures do not pin them here:
- Which model each run trained: AxoNN's weak scaling keeps about 10M parameters per GPU (GPT-5B on 512 GPUs ...
  GPT-320B on 32,768), so the model of N GPUs is the named size of about N x 10M parameters (see WEAK_SCALING).
- The batch: 4,096 sequences of 4,096 tokens (16.8M tokens) at every size, as in the issue's account of the paper.
  On 6,144 and 32,768 GPUs it does not divide by the world size, so those runs use the shared rows layout
  (`goldfish train --rows shared`: every GPU of an x*y group reads the group's rows, AxoNN's layout; the batch
  need only divide by data*z); the planner weighs both layouts on every grid and reports the one it picks.
- Weak-scaling efficiency is predicted flop/s per GPU at N GPUs over that of the smallest run of the series.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

from engine.planner.cost_model import NAMED_SHAPES, model_flops_per_token  # noqa: E402
from engine.planner.plan import PlanRequest, rank_grids  # noqa: E402
from engine.planner.profiles import PROFILES  # noqa: E402

AXONN_BATCH, SEQ = 4096, 4096
# machine -> (GPUs, named size) of the weak-scaling series (about 10M parameters per GPU, see the module doc)
WEAK_SCALING = {
    "perlmutter": [(512, "5B"), (1024, "10B"), (2048, "20B"), (4096, "40B")],
    "frontier": [(512, "5B"), (1024, "10B"), (2048, "20B"), (4096, "40B"), (8192, "80B"), (32768, "320B")],
    "alps": [(1024, "10B"), (2048, "20B"), (4096, "40B"), (6144, "60B")],
}
# machine -> (GPUs, published sustained flop/s)
PUBLISHED_FLOPS = {"perlmutter": (4096, 620.1e15), "frontier": (32768, 1.381e18), "alps": (6144, 1.423e18)}
# machine -> (GPUs, published weak-scaling efficiency)
PUBLISHED_WEAK = {"frontier": (8192, 0.883), "alps": (6144, 0.765)}


def predict(machine: str, gpus: int, model: str, efficiency: float) -> dict[str, Any]:
    """The fastest feasible plan of `model` on `gpus` GPUs of `machine` with AxoNN's batch (either rows layout)."""
    shape, profile = NAMED_SHAPES[model], PROFILES[machine]
    out: dict[str, Any] = {
        "machine": machine,
        "gpus": gpus,
        "model": shape.name,
        "params": shape.n_params,
        "seq": SEQ,
        "axonn_batch": AXONN_BATCH,
    }
    batch = AXONN_BATCH
    request = PlanRequest(
        shape=shape, gpus=gpus, global_batch=batch, seq=SEQ, profile=profile, compute_efficiency=efficiency
    )
    plans = rank_grids(request)
    out["batch"] = batch
    best = plans[0]
    if not best.feasible:
        out["feasible"] = False
        out["reason"] = best.reason
        return out
    useful = model_flops_per_token(shape, SEQ) * batch * SEQ
    # what the engine's step would sustain if every collective hid behind compute (AxoNN overlaps most of them;
    # the planner sums them): a bound that shows how much of the gap overlap could explain
    hidden = max(best.compute_s + best.memory_s, best.comm_s)
    out.update(
        feasible=True,
        flops=useful / best.step_s,
        flops_per_gpu=useful / best.step_s / gpus,
        flops_comm_hidden=useful / hidden,
        plan=best.to_json(),
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="bench/results/axonn_runs.json")
    parser.add_argument("--plot", default="bench/results/axonn_weak_scaling.png")
    parser.add_argument(
        "--compute-efficiency",
        type=float,
        default=0.5,
        help="fraction of peak the matrix products reach (the planner's default: %(default)s)",
    )
    args = parser.parse_args()
    series: dict[str, list[dict[str, Any]]] = {}
    for machine, runs in WEAK_SCALING.items():
        series[machine] = []
        for gpus, model in runs:
            result = predict(machine, gpus, model, args.compute_efficiency)
            series[machine].append(result)
            flops = f"{result['flops'] / 1e15:9.1f} Pflop/s" if result["feasible"] else "does not fit"
            print(f"{machine:>10} {gpus:>6} GPUs {result['model']:>9}: {flops}", flush=True)
        base = next((r for r in series[machine] if r["feasible"]), None)
        for r in series[machine]:
            if base is not None and r["feasible"]:
                r["weak_scaling_efficiency"] = r["flops_per_gpu"] / base["flops_per_gpu"]
    table = []
    for machine, (gpus, published) in PUBLISHED_FLOPS.items():
        run = next(r for r in series[machine] if r["gpus"] == gpus)
        predicted = run.get("flops")
        table.append(
            {
                "machine": machine,
                "gpus": gpus,
                "model": run["model"],
                "published_flops": published,
                "predicted_flops": predicted,
                "batch": run["batch"],
                "predicted_flops_comm_hidden": run.get("flops_comm_hidden"),
                "error": None if predicted is None else predicted / published - 1,
            }
        )
    weak = []
    for machine, (gpus, published) in PUBLISHED_WEAK.items():
        run = next(r for r in series[machine] if r["gpus"] == gpus)
        predicted = run.get("weak_scaling_efficiency")
        weak.append(
            {
                "machine": machine,
                "gpus": gpus,
                "published": published,
                "predicted": predicted,
                "error": None if predicted is None else predicted - published,
            }
        )
    for row in table:
        plan = next(r for r in series[row["machine"]] if r["gpus"] == row["gpus"])["plan"]
        grid = ",".join(f"{a}={v}" for a, v in plan["grid"].items() if v > 1)
        print(
            f"{row['machine']:>10} {row['gpus']:>6}: grid {grid}, rows {plan['rows']}, zero {plan['zero']}, "
            f"accum {plan['grad_accum']}, ckpt {plan['checkpointing']}"
        )
        print(
            f"{row['machine']:>10} {row['gpus']:>6}: published {row['published_flops'] / 1e15:8.1f} Pflop/s, "
            f"predicted {row['predicted_flops'] / 1e15:8.1f} Pflop/s ({row['error']:+.1%}); communication hidden: "
            f"{row['predicted_flops_comm_hidden'] / 1e15:8.1f} Pflop/s"
        )
    for row in weak:
        print(
            f"{row['machine']:>10} {row['gpus']:>6}: weak scaling published {row['published']:.1%}, "
            f"predicted {row['predicted']:.1%}"
        )
    common.write_result(
        args.out,
        {
            "compute_efficiency": args.compute_efficiency,
            "seq": SEQ,
            "axonn_batch": AXONN_BATCH,
            "flops": table,
            "weak_scaling": weak,
            "series": series,
        },
    )
    print(f"wrote {args.out}")
    if args.plot:
        plot(series, args.plot)
        print(f"wrote {args.plot}")


def plot(series: dict[str, list[dict[str, Any]]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for machine, runs in series.items():
        runs = [r for r in runs if r["feasible"]]
        gpus = [r["gpus"] for r in runs]
        (line,) = left.plot(
            gpus, [100 * r["weak_scaling_efficiency"] for r in runs], "o-", label=f"{machine} (predicted)"
        )
        right.plot(
            gpus, [r["flops"] / 1e15 for r in runs], "o-", color=line.get_color(), label=f"{machine} (predicted)"
        )
        if machine in PUBLISHED_WEAK:
            n, value = PUBLISHED_WEAK[machine]
            left.plot([n], [100 * value], "*", ms=14, color=line.get_color(), label=f"{machine} (published)")
        if machine in PUBLISHED_FLOPS:
            n, value = PUBLISHED_FLOPS[machine]
            right.plot([n], [value / 1e15], "*", ms=14, color=line.get_color(), label=f"{machine} (published)")
    for axis in (left, right):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("GPUs (GCDs on Frontier); model of ~10M parameters per GPU")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    left.set_ylabel("weak-scaling efficiency (%)")
    left.set_title("Weak scaling: predicted vs published")
    right.set_yscale("log")
    right.set_ylabel("sustained Pflop/s (model FLOPs)")
    right.set_title("Sustained flop/s")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
