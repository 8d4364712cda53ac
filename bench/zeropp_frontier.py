"""The planner's prediction for the Frontier ZeRO++ study's 20B GPT on 384 GCDs: ZeRO-3, ZeRO++ and three levels.

Paper (seed 001): Xu et al., "Scaling Large Language Model Training on Frontier with Low-Bandwidth Partitioning",
arXiv 2501.04266. Published for a 20B GPT with pure data parallelism under ZeRO-3 on up to 384 GCDs (48 nodes):
ZeRO++ (two-level hpZ, qwZ, qgZ) +40.5% TFLOPS over ZeRO-3, and the three-level partitioning (GCD pair, node,
nodes) 1.71x the TFLOPS of ZeRO++.

Usage (no GPU needed: it only runs the planner; seconds on one core):

    python bench/zeropp_frontier.py --out bench/results/zeropp_frontier.json

On the frontier profile (engine.planner.profiles) it pins the paper's grid, data=384, and ZeRO stage 3, and plans
three settings as `goldfish train` would run them (engine.planner.plan.plan_grid: activation checkpointing and
micro-batches as the planner picks them, the fastest that fits in 64 GiB):

- ZeRO-3: flat over the 384 data ranks;
- ZeRO++: hierarchy node (8 GCDs per node: --zero-hierarchy 8), qwZ and qgZ with int4 gradient codes, as ZeRO++
  quantizes gradients;
- three levels: hierarchy package,node (--zero-hierarchy 2,8), qwZ and qgZ int4.

Assumptions, stated because the paper's text we could read does not pin them:
- The model: GPT-NeoX-20B's published sizes (the planner's `neox-20b`: 44 layers, hidden 6,144, 64 heads,
  vocabulary 50,432, 2,048-token sequences).
- The batch: ROWS_PER_GCD sequences per GCD per step (1 and 4), as the planner's grid runs them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

from engine.core.grid import GridShape  # noqa: E402
from engine.planner.cost_model import NAMED_SHAPES  # noqa: E402
from engine.planner.plan import PlanRequest, plan_grid, train_command  # noqa: E402
from engine.planner.profiles import PROFILES  # noqa: E402

MODEL, GCDS, SEQ = "NEOX-20B", 384, 2048
ROWS_PER_GCD = (1, 4)
QGZ_BITS = 4  # ZeRO++'s qgZ reduces gradients in int4
# name -> (hierarchy of engine.planner.plan.HIERARCHIES, quantized parts)
SETTINGS: dict[str, tuple[str, tuple[str, ...]]] = {
    "ZeRO-3": ("off", ()),
    "ZeRO++": ("node", ("weights", "gradients")),
    "three levels": ("package,node", ("weights", "gradients")),
}
PUBLISHED = {"ZeRO++ over ZeRO-3": 1.405, "three levels over ZeRO++": 1.71}


def predict(rows_per_gcd: int, setting: str, efficiency: float = 0.5) -> dict[str, Any]:
    """The planner's plan of `setting` on grid data=384 (ZeRO-3 pinned) at `rows_per_gcd` sequences per GCD."""
    hierarchy, parts = SETTINGS[setting]
    request = PlanRequest(
        shape=NAMED_SHAPES[MODEL],
        gpus=GCDS,
        global_batch=GCDS * rows_per_gcd,
        seq=SEQ,
        profile=PROFILES["frontier"],
        compute_efficiency=efficiency,
        zero_stages=(3,),
        hierarchies=(hierarchy,),
        quantize=(parts,),
        gradient_bits=QGZ_BITS if "gradients" in parts else 8,
    )
    plan = plan_grid(request, GridShape(data=GCDS))
    if not plan.feasible:
        raise SystemExit(f"{setting} at {rows_per_gcd} rows per GCD does not fit: {plan.reason}")
    return {
        "setting": setting,
        "rows_per_gcd": rows_per_gcd,
        "step_s": plan.step_s,
        "compute_s": plan.compute_s,
        "memory_s": plan.memory_s,
        "comm_s": plan.comm_s,
        "tflops_per_gcd": plan.mfu * request.profile.peak_tflops,
        "command": train_command(request, plan).split(" -m ")[1],
        "plan": plan.to_json(),
    }


def compare(efficiency: float = 0.5) -> list[dict[str, Any]]:
    """Every setting at every batch, with each one's gain (step-time ratio) over the setting before it."""
    rows = []
    for per in ROWS_PER_GCD:
        previous = None
        for setting in SETTINGS:
            row = predict(per, setting, efficiency)
            row["gain_over_previous"] = None if previous is None else previous["step_s"] / row["step_s"]
            rows.append(row)
            previous = row
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="bench/results/zeropp_frontier.json")
    parser.add_argument(
        "--compute-efficiency",
        type=float,
        default=0.5,
        help="fraction of peak the matrix products reach (the planner's default: %(default)s)",
    )
    args = parser.parse_args()
    rows = compare(args.compute_efficiency)
    print(f"{'rows/GCD':>8} {'setting':>13} {'step s':>7} {'comm s':>7} {'Tflop/s/GCD':>11} {'gain':>6}  command")
    for r in rows:
        gain = "" if r["gain_over_previous"] is None else f"{r['gain_over_previous']:.2f}x"
        print(
            f"{r['rows_per_gcd']:>8} {r['setting']:>13} {r['step_s']:>7.2f} {r['comm_s']:>7.2f} "
            f"{r['tflops_per_gcd']:>11.1f} {gain:>6}  {r['command']}"
        )
    print("published: " + ", ".join(f"{k} {v:.3g}x" for k, v in PUBLISHED.items()))
    common.write_result(
        args.out,
        {"model": MODEL, "gcds": GCDS, "seq": SEQ, "compute_efficiency": args.compute_efficiency, "rows": rows},
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
