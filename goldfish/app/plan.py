"""`goldfish plan`: rank the 5D grids (pipe x data x X x Y x Z) of a cluster for a model (engine.planner.plan), or
profile a cluster under torchrun."""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from engine import (
    CHECKPOINTING,
    DEFAULT_PIPE_SCHEDULES,
    DEFAULT_QUANT_BLOCK,
    HIERARCHIES,
    NAMED_SHAPES,
    PIPE_SCHEDULES,
    PLAN_PRECISION,
    PRECISIONS,
    PROFILES,
    QUANT_BITS,
    STAGES,
    GridPlan,
    PlanRequest,
    TransformerShape,
    format_table,
    launch_nodes,
    load_profile,
    parse_quantize,
    rank_grids,
    train_command,
)
from goldfish.app import paper
from goldfish.app.argparsing import OneLineParser, Unset, argument_type, mark_defaults, resolve_defaults
from goldfish.app.planning import resolve_shape
from goldfish.app.presets import PLAN_PRESETS, paper_plan

DEFAULT_PROFILE = "perlmutter"
# The published models of the named sizes (engine.planner.cost_model.NAMED_SHAPES), as `goldfish train --model`
# takes them; the AxoNN paper's GPT sizes are shapes without published weights.
HUB_MODELS = {
    "7B": "meta-llama/Llama-2-7b-hf",
    "8B": "meta-llama/Llama-3.1-8B",
    "70B": "meta-llama/Llama-2-70b-hf",
    "405B": "meta-llama/Llama-3.1-405B",
    "NEOX-20B": "EleutherAI/gpt-neox-20b",
}
MODEL_VARIABLE = '"$MODEL"'  # where no published model has the planned shape: the user's folder of that shape
PLAN_OUT = "runs/plan"  # the printed command's --out


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `goldfish plan`."""
    parser.add_argument(
        "--preset",
        choices=sorted(PLAN_PRESETS),
        default=None,
        help="the model, cluster and step of a documented run; options given explicitly override it. paper: the "
        f"goldfish paper's TinyLlama-1.1B on {paper_plan().gpus} GPUs of {paper_plan().profile} "
        f"({paper.BATCH} x {paper.SEQ_LEN} tokens per step), with the time of its {paper.PLAN_STEPS:,} steps "
        "(docs/corpus.md)",
    )
    parser.add_argument(
        "--model",
        default=None,
        help=f"named size ({', '.join(NAMED_SHAPES)}; 5B-640B: the AxoNN paper's GPT models), {paper.MODEL} (the "
        "goldfish paper's model) or a transformers config (a folder, its config.json or a hub name) of any family the "
        "engine shards (Llama, GPT-NeoX, Phi-3, OLMo2, ...)",
    )
    parser.add_argument("--gpus", type=int, default=None, help="number of GPUs (world size)")
    parser.add_argument(
        "--profile",
        default=None,
        help=f"machine: {', '.join(PROFILES)}, or a profile JSON from --measure (default: {DEFAULT_PROFILE}, named "
        "with the command it prints)",
    )
    parser.add_argument("--gpus-per-node", type=int, default=None, help="override the profile's GPUs per node")
    parser.add_argument("--gpu-memory", type=float, default=None, help="override the profile's GiB per GPU")
    parser.add_argument("--seq-len", type=int, default=4096, help="tokens per sequence (default: %(default)s)")
    parser.add_argument(
        "--global-batch",
        type=int,
        default=None,
        help="sequences per optimizer step (default: the smallest multiple of --gpus >= 1024)",
    )
    parser.add_argument(
        "--grad-accum",
        type=int,
        default=None,
        help="micro-batches per step (default: per grid, the fewest that fit in memory)",
    )
    parser.add_argument(
        "--checkpointing",
        choices=CHECKPOINTING,
        default="auto",
        help="activation checkpointing of decoder layers; auto: per grid, whichever is faster "
        "among the settings that fit (default: %(default)s)",
    )
    parser.add_argument(
        "--precision",
        choices=sorted(PRECISIONS),
        default=PLAN_PRECISION,
        help="as goldfish train --precision: bf16 = autocast (bf16 matrix products over fp32 "
        "weights and AdamW state), fp32 (default: %(default)s)",
    )
    parser.add_argument(
        "--compute-efficiency",
        type=float,
        default=0.5,
        help="fraction of peak the matrix products reach (default: %(default)s)",
    )
    zero = parser.add_argument_group("ZeRO (the settings considered per grid; the fastest is kept)")
    zero.add_argument(
        "--zero",
        type=int,
        nargs="+",
        choices=STAGES,
        default=list(STAGES),
        metavar="STAGE",
        help="ZeRO stages to consider, as goldfish train --zero (default: all, 0 1 2 3); --zero 3 pins stage 3",
    )
    zero.add_argument(
        "--zero-hierarchy",
        nargs="+",
        choices=HIERARCHIES,
        default=["off"],
        metavar="LEVELS",
        help="hierarchical partitioning of stages 2 and 3 to consider, sized from the profile: off (flat), node "
        "(the data ranks of a node, then the nodes: ZeRO++'s hpZ), package,node (the data ranks of a package, such "
        "as the two GCDs of an MI250X, then the node, then the nodes); several are weighed against each other, e.g. "
        "--zero-hierarchy off node package,node (default: off)",
    )
    zero.add_argument(
        "--zero-quantize",
        type=argument_type(parse_quantize),
        nargs="+",
        default=[()],
        metavar="PARTS",
        help="ZeRO++ quantized collectives of stages 2 and 3 to consider: none, weights (qwZ: int8 weight gathers), "
        "gradients (qgZ: quantized all-to-all reductions) or weights,gradients; several are weighed against each "
        "other, e.g. --zero-quantize none weights,gradients (default: none)",
    )
    zero.add_argument(
        "--zero-quantize-bits",
        type=int,
        choices=QUANT_BITS,
        default=8,
        help="bits of qgZ's gradient codes, as goldfish train --zero-quantize-bits (default: %(default)s)",
    )
    zero.add_argument(
        "--zero-quantize-block",
        type=int,
        default=DEFAULT_QUANT_BLOCK,
        metavar="ELEMENTS",
        help="elements per float32 scale of qwZ and qgZ, as goldfish train --zero-quantize-block "
        "(default: %(default)s)",
    )
    pipe = parser.add_argument_group("pipeline (the settings considered per grid; the fastest is kept)")
    pipe.add_argument(
        "--pipe",
        type=int,
        nargs="+",
        default=None,
        metavar="P",
        help="pipeline sizes to consider, as goldfish train --grid pipe=P (default: every divisor of --gpus up to the "
        "model's decoder layers, or 1 for a model the engine cannot pipeline); --pipe 1: no pipeline; --pipe 16 pins "
        "it",
    )
    pipe.add_argument(
        "--pipe-schedule",
        nargs="+",
        choices=list(PIPE_SCHEDULES),
        default=list(DEFAULT_PIPE_SCHEDULES),
        metavar="SCHEDULE",
        help=f"pipeline schedules to weigh, as goldfish train --pipe-schedule: {', '.join(PIPE_SCHEDULES)} (default: "
        f"{' '.join(DEFAULT_PIPE_SCHEDULES)}; zero-bubble only when named: the model does not charge its split "
        "backward)",
    )
    pipe.add_argument(
        "--pipe-virtual",
        type=int,
        nargs="+",
        default=[2],
        metavar="V",
        help="stages per rank to weigh for the interleaved schedules, as goldfish train --pipe-virtual "
        "(default: %(default)s)",
    )
    pipe.add_argument(
        "--microbatches",
        type=int,
        default=None,
        metavar="M",
        help="pipeline micro-batches per step and data rank, as goldfish train --microbatches (default: per grid, "
        "the fastest that fits)",
    )
    parser.add_argument("--top", type=int, default=20, help="rows of the table (default: %(default)s)")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write every grid's prediction as JSON")
    measure = parser.add_argument_group("measure (run under torchrun on the cluster to profile)")
    measure.add_argument(
        "--measure",
        default=None,
        metavar="OUT.json",
        help="time all-reduce, all-gather, reduce-scatter and all-to-all for every group size and placement "
        "of this torchrun world and write a profile (figures not measured come from "
        "--profile)",
    )
    measure.add_argument(
        "--measure-mib",
        type=float,
        nargs=2,
        default=(0.0625, 64.0),
        metavar=("SMALL", "LARGE"),
        help="message sizes in MiB: the small one gives latency, the large one bandwidth",
    )
    measure.add_argument("--measure-iters", type=int, default=10, help="timed calls per size (default: %(default)s)")


def parse_plan_args(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """The options parsed once, every option not typed taking `--preset NAME`'s value (goldfish.app.presets), else its
    default: what the user typed wins over the preset, as with `goldfish compare --preset`."""
    mark_defaults(parser)
    parsed = parser.parse_args(argv)
    preset = parsed.preset.value if isinstance(parsed.preset, Unset) else parsed.preset
    args, _ = resolve_defaults(parser, parsed, [PLAN_PRESETS[preset]().options() if preset else {}])
    return args


def paper_shape() -> TransformerShape:
    """The goldfish paper's TinyLlama-1.1B (goldfish.app.paper.TINYLLAMA) as the planner's shape."""
    sizes = paper.TINYLLAMA
    return TransformerShape(
        hidden=sizes["hidden"],
        layers=sizes["layers"],
        heads=sizes["heads"],
        kv_heads=sizes["kv_heads"],
        intermediate=sizes["intermediate"],
        vocab=sizes["vocab"],
        name="TinyLlama-1.1B",
    )


def run_time(plans: list[GridPlan], steps: int, models: int) -> str | None:
    """One line: `steps` optimizer steps of each of `models` models at the fastest feasible grid's step time."""
    best = min((p for p in plans if p.feasible), key=lambda p: p.step_s, default=None)
    if best is None:
        return None
    hours = best.step_s * steps / 3600
    return (
        f"the paper's run: {steps:,} steps x {best.step_s:.3g} s on grid {best.grid} = {hours:.1f} h per model, "
        f"{hours * models:.1f} h for the {models} models goldfish compare trains (standard + {models - 1} masks)"
    )


def request_from_args(args: argparse.Namespace) -> PlanRequest:
    if args.model is None or args.gpus is None:
        raise ValueError("goldfish plan needs --model and --gpus (or --measure OUT.json under torchrun)")
    if args.gpus < 1:
        raise ValueError(f"--gpus must be >= 1, got {args.gpus}")
    profile = load_profile(args.profile or DEFAULT_PROFILE)
    overrides: dict[str, Any] = {}
    if args.gpus_per_node is not None:
        overrides["gpus_per_node"] = args.gpus_per_node
    if args.gpu_memory is not None:
        overrides["gpu_memory_gib"] = args.gpu_memory
    if args.gpus_per_node is not None and args.gpus_per_node % profile.package_size:
        overrides["package_size"] = 1  # nodes that hold no whole package: no package level
    if overrides:
        profile = replace(profile, **overrides)
    batch = args.global_batch
    if batch is None:
        batch = args.gpus * math.ceil(1024 / args.gpus)
    return PlanRequest(
        shape=paper_shape() if args.model == paper.MODEL else resolve_shape(args.model),
        gpus=args.gpus,
        global_batch=batch,
        seq=args.seq_len,
        profile=profile,
        compute_efficiency=args.compute_efficiency,
        grad_accum=args.grad_accum,
        precision=args.precision,
        checkpointing=args.checkpointing,
        zero_stages=tuple(dict.fromkeys(args.zero)),
        hierarchies=tuple(dict.fromkeys(args.zero_hierarchy)),
        quantize=tuple(dict.fromkeys(args.zero_quantize)),
        gradient_bits=args.zero_quantize_bits,
        quantize_block=args.zero_quantize_block,
        pipe_sizes=None if args.pipe is None else tuple(dict.fromkeys(args.pipe)),
        pipe_schedules=tuple(dict.fromkeys(args.pipe_schedule)),
        pipe_virtual=tuple(dict.fromkeys(args.pipe_virtual)),
        microbatches=args.microbatches,
    )


def train_model_option(model: str) -> tuple[str, str | None]:
    """What `goldfish train --model` takes for plan's --model, and a line to print before the command when the user
    must fill it in: a named size's published model, a config.json's folder, else the name as given."""
    if model.upper() in HUB_MODELS:
        return HUB_MODELS[model.upper()], None
    if model.upper() in NAMED_SHAPES:
        name = NAMED_SHAPES[model.upper()].name
        return MODEL_VARIABLE, (
            f"{name} is a shape of the AxoNN paper without published weights: set MODEL to a model folder of that shape"
        )
    path = Path(model)
    if path.name == "config.json" and path.is_file():  # goldfish train loads the folder
        return str(path.parent), None
    return model, None


def fastest_command(args: argparse.Namespace, request: PlanRequest, plans: list[GridPlan]) -> list[str]:
    """The lines that end the plan: which machine was assumed and how to start the run, then the fastest grid's
    `goldfish train` command on a line of its own, to paste as it is (None when no grid fits)."""
    best = next((p for p in plans if p.feasible), None)
    if best is None:
        return []
    model, note = train_model_option(args.model)
    profile = request.profile
    assumed = " (assumed: no --profile was given; name yours with --profile)" if args.profile is None else ""
    lines = [
        f"machine: {profile.name}, {profile.gpus_per_node} GPUs of {profile.gpu_memory_gib:g} GiB per node{assumed}"
    ]
    nodes, _ = launch_nodes(request.gpus, profile.gpus_per_node)
    where = (
        f"; start it on each of the {nodes} nodes, with MASTER_ADDR set to the first node's address"
        if nodes > 1
        else ""
    )
    lines += [note] if note else []
    lines.append(f"the fastest grid, as goldfish train runs it{where}:")
    lines.append(train_command(request, best, leading=[f"--model {shlex.quote(model)}", f"--out {PLAN_OUT}"]))
    if model == MODEL_VARIABLE:  # the variable stays for the shell to expand, not quoted away
        lines[-1] = lines[-1].replace(shlex.quote(MODEL_VARIABLE), MODEL_VARIABLE)
    return lines


def run_plan(args: argparse.Namespace) -> int:
    """`goldfish plan`: print the ranked grids (and write JSON), or with --measure profile this cluster."""
    if args.measure is not None:
        from engine import measure_profile

        base = load_profile(args.profile or DEFAULT_PROFILE)
        profile = measure_profile(
            base,
            small_bytes=int(args.measure_mib[0] * 2**20),
            large_bytes=int(args.measure_mib[1] * 2**20),
            iters=args.measure_iters,
        )
        if profile is not None:  # rank 0
            profile.save(args.measure)
            print(
                f"wrote {args.measure}: {len(profile.measured)} measured collectives, intra-node "
                f"{profile.intra_node_gbps:.3g} GB/s, inter-node {profile.inter_node_gbps:.3g} GB/s, "
                f"{profile.peak_tflops:.3g} Tflop/s per device"
            )
        return 0
    request = request_from_args(args)
    plans = rank_grids(request)
    print(format_table(request, plans, top=args.top))
    for line in fastest_command(args, request, plans):
        print(line)
    estimate = run_time(plans, paper.PLAN_STEPS, paper.PLAN_MODELS) if args.preset == "paper" else None
    if estimate is not None:
        print(estimate)
    if args.json:
        payload = {
            "request": {
                "model": request.shape.name,
                "shape": asdict(request.shape),
                "gpus": request.gpus,
                "global_batch": request.global_batch,
                "seq": request.seq,
                "compute_efficiency": request.compute_efficiency,
                "precision": request.precision,
                "zero": {  # the settings weighed; each grid's chosen one is under grids[i]["zero"]
                    "stages": list(request.zero_stages),
                    "hierarchies": list(request.hierarchies),
                    "quantize": [",".join(q) or "none" for q in request.quantize],
                    "gradient_bits": request.gradient_bits,
                    "quantize_block": request.quantize_block,
                },
                "pipeline": {  # the settings weighed; each pipelined grid's choice is under grids[i]["pipeline"]
                    "pipe_sizes": request.pipes,
                    "schedules": list(request.pipe_schedules),
                    "virtual": list(request.pipe_virtual),
                    "microbatches": request.microbatches,
                },
                "profile": request.profile.to_json(),
            },
            "grids": [p.to_json() for p in plans],
        }
        from data.atomic import write_json_atomic  # data's package loads tokenizers: only when writing

        write_json_atomic(args.json, payload, indent=1)
        print(f"wrote {args.json}")
    if not any(p.feasible for p in plans):
        # The table says why; the exit status lets scripts tell "no plan" from a plan.
        need = min((p for p in plans if p.memory is not None), key=lambda p: p.memory.total, default=None)
        estimate = (
            ""
            if need is None
            else (
                f" (the planner's estimate: at least {need.memory.total / 2**30:.1f} GiB per GPU, on grid {need.grid})"
            )
        )
        print(
            f"goldfish plan: error: no grid of {request.gpus} GPUs fits {request.shape.name or 'the model'} at "
            f"global batch {request.global_batch} x {request.seq} tokens{estimate}. Fix: more --gpus, a larger "
            "--gpu-memory, or a smaller --global-batch/--seq-len (with --checkpointing auto or on).",
            file=sys.stderr,
        )
        return 1
    return 0


def main(argv: list[str]) -> int:
    """`goldfish plan ARGS` on its own: the planner is plain Python, so this path imports neither torch nor the
    rest of the application (goldfish.app.entry sends `plan` here)."""
    parser = OneLineParser(
        prog="goldfish plan",
        description="rank the 5D grids (pipe x data x X x Y x Z) for a "
        "model on a cluster by predicted step time, with memory per GPU",
    )
    add_plan_arguments(parser)
    args = parse_plan_args(parser, argv)
    try:
        return run_plan(args)
    except (ValueError, FileNotFoundError) as error:
        print(f"goldfish plan: error: {error}", file=sys.stderr)
        return 2
