"""The planner's pipe axis: the bubble's closed forms, the micro-batches each rank holds, the point-to-point bytes,
each stage's memory, the refusals, the 5D enumeration, the `goldfish train` command of a pipelined plan, and the shape
of Llama 3 405B's published run (TP8 x PP16 x DP128 on 16,384 H100, "The Llama 3 Herd of Models", Table 4).

References: bytes, bubbles and in-flight counts computed by hand below; the engine's own cut of the layers
(engine.training.pipeline.balanced_splits), its schedule checks (engine.spec.PipeConfig) and its family check
(engine.models.stages.check_model).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from plan_refusals import assert_plan_refuses
from tiny_models import tiny_family

from engine.models.shape import model_planner_shape
from engine.planner.cost_model import (
    NAMED_SHAPES,
    PIPELINE_FAMILIES,
    StepSettings,
    TransformerShape,
    count_grids,
    memory_per_rank,
    model_flops_per_token,
    pipe_rank_shape,
    pipeline_bubble,
    pipeline_in_flight,
    pipeline_p2p_bytes,
    stage_layer_counts,
)
from engine.planner.plan import (
    GIB,
    PIPE_ROWS_LAYOUTS,
    PIPE_ZERO_STAGES,
    PlanRequest,
    pipeline_memory,
    plan_grid,
    rank_grids,
    train_command,
)
from engine.planner.profiles import PROFILES
from engine.spec import ROWS_LAYOUTS, STAGES, GridShape, PipeConfig
from goldfish.app.plan import main as plan_main

ROOT = Path(__file__).resolve().parents[2]
SMALL = TransformerShape(hidden=256, layers=8, heads=4, kv_heads=4, intermediate=512, vocab=1024, name="small")


def _request(**overrides) -> PlanRequest:
    base = dict(shape=SMALL, gpus=8, global_batch=64, seq=256, profile=PROFILES["dgx-h100"])
    base.update(overrides)
    return PlanRequest(**base)


def test_bubble_closed_forms() -> None:
    # P = 4 ranks, M = 8 micro-batches, V = 2 stages per rank
    assert pipeline_bubble("gpipe", 4, 8) == pipeline_bubble("1f1b", 4, 8) == 3 / 11
    assert pipeline_bubble("interleaved-1f1b", 4, 8, 2) == 3 / 19
    assert pipeline_bubble("zero-bubble", 4, 8, 2) == 3 / 51
    assert pipeline_bubble("1f1b", 1, 8) == 0.0  # no pipeline, no bubble
    # the model column of docs/pipeline.md's measured table (bench/pipeline.py calls pipeline_bubble)
    text = (ROOT / "docs" / "pipeline.md").read_text(encoding="utf-8")
    for name, schedule in (("GPipe", "gpipe"), ("1F1B", "1f1b"), ("interleaved 1F1B", "interleaved-1f1b")):
        v = 2 if schedule == "interleaved-1f1b" else 1
        assert f"| {name} | {v} | " in text and f" | {pipeline_bubble(schedule, 4, 8, v):.1%} | " in text
    assert "pipeline_bubble(schedule, p_, m, v)" in (ROOT / "bench" / "pipeline.py").read_text(encoding="utf-8")
    with pytest.raises(ValueError, match="at least as many micro-batches as pipeline ranks"):
        pipeline_bubble("1f1b", 4, 2)


def test_micro_batches_in_flight_follow_the_schedules_order() -> None:
    assert pipeline_in_flight("gpipe", 4, 8) == 8  # every forward before any backward
    assert [pipeline_in_flight("1f1b", 4, 8, rank=r) for r in range(4)] == [4, 3, 2, 1]
    # interleaved, P=4, V=2, M=8: 2 rounds of 4; rank 0 warms up (2-1)*4 + 2*3 = 10 chunks, holds 11 of 1/2 each
    assert pipeline_in_flight("interleaved-1f1b", 4, 8, 2, rank=0) == 5.5
    assert pipeline_in_flight("interleaved-1f1b", 4, 8, 2, rank=3) == 2.5  # 4 warm-up chunks + 1
    # zero bubble: (2-1)*4 + (3-r) warm-up chunks, kept r actions longer for the deferred weight gradients: 8 chunks
    assert [pipeline_in_flight("zero-bubble", 4, 8, 2, rank=r) for r in range(4)] == [4.0] * 4
    assert pipeline_in_flight("interleaved-1f1b", 4, 2, 2) == 2  # capped: all V M = 4 chunks


def test_micro_batches_in_flight_equal_torchs_action_order() -> None:
    """The peak of chunks held (forwards not yet freed by their backward, or by their weight gradient under zero
    bubble) in the action lists torch's interleaved schedules compute for each rank (their own private planning
    method, on a schedule object given only the sizes it reads), against pipeline_in_flight."""
    from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble

    def held(cls: type, p: int, m: int, v: int, rank: int, frees: str) -> float:
        schedule = object.__new__(cls)
        schedule.n_local_stages, schedule.pp_group_size, schedule._n_microbatches = v, p, m
        schedule.number_of_rounds = max(1, m // p)
        schedule.microbatches_per_round = m // schedule.number_of_rounds
        now = peak = 0
        for action in filter(None, schedule._calculate_single_rank_operations(rank)):
            kind = action.computation_type.value
            now += (kind == "F") - (kind == frees)
            peak = max(peak, now)
        return peak / v

    for cls, name, frees in (
        (ScheduleInterleaved1F1B, "interleaved-1f1b", "B"),
        (ScheduleInterleavedZeroBubble, "zero-bubble", "W"),
    ):
        for p, v, m in ((2, 2, 2), (4, 2, 8), (4, 3, 16), (8, 4, 8)):
            for rank in range(p):
                assert held(cls, p, m, v, rank, frees) == pipeline_in_flight(name, p, m, v, rank), (name, p, v, m, rank)


def test_the_cut_is_the_engines() -> None:
    from engine.models.stages import pipeline_families
    from engine.training.pipeline import balanced_splits

    assert set(PIPELINE_FAMILIES) == set(pipeline_families())
    for layers in (2, 7, 8, 80, 126):
        for stages in (1, 2, 3, 16, layers):
            if stages <= layers:
                bounds = [0, *balanced_splits([1] * layers, stages), layers]
                assert stage_layer_counts(layers, stages) == [b - a for a, b in zip(bounds, bounds[1:])]
    first, middle, last = (pipe_rank_shape(NAMED_SHAPES["405B"], 16, 2, r) for r in (0, 7, 15))
    assert (first.runs_embeddings, first.runs_head, last.runs_embeddings, last.runs_head) == (True, False, False, True)
    assert first.vocab_params == last.vocab_params == 128256 * 16384 and middle.vocab_params == 0
    assert (
        sum(pipe_rank_shape(NAMED_SHAPES["405B"], 16, 2, r).n_params for r in range(16))
        == NAMED_SHAPES["405B"].n_params
    )


def test_point_to_point_bytes_per_rank_hand_computed() -> None:
    grid = GridShape(pipe=2, x=2)  # own rows: the x group's decoder runs on 2 x 1 rows, held by both x ranks
    message = 2 * 8 * 256 * 4  # (rows of the x*y group, seq, hidden) fp32 hidden states or their gradient
    step = StepSettings(rows_per_rank=1, seq=8, grad_accum=4, stream_bytes=4)  # 4 micro-batches
    assert pipeline_p2p_bytes(SMALL, grid, step, rank=0) == 4 * message  # forward only
    assert pipeline_p2p_bytes(SMALL, grid, step, rank=1) == 4 * message  # gradients back only
    # interleaved, V=2: rank 0 holds stages 0 and 2 of 4 (2 forwards, 1 backward), rank 1 stages 1 and 3 (1 + 2)
    assert pipeline_p2p_bytes(SMALL, grid, step, rank=0, virtual=2) == 3 * 4 * message
    # the shared layout: every rank of x*y reads the group's rows itself, here the same 2 rows
    shared = replace(step, rows_per_rank=2, rows="shared")
    assert pipeline_p2p_bytes(SMALL, grid, shared, rank=0) == 4 * message
    plain = GridShape(pipe=4)  # without tensor parallelism: (B/M, T, H) per micro-batch, as bench/pipeline.py
    assert pipeline_p2p_bytes(SMALL, plain, step, rank=1) == 2 * 4 * (1 * 8 * 256 * 4)


def test_stage_memory_falls_with_more_stages() -> None:
    shape = NAMED_SHAPES["70B"]
    peaks, params = [], []
    for p in (2, 4, 8, 16):
        request = PlanRequest(shape=shape, gpus=p, global_batch=64, seq=2048, profile=PROFILES["dgx-h100"])
        memory = pipeline_memory(request, GridShape(pipe=p), "1f1b", 64, recompute=True)
        peaks.append(max(m.total for m in memory))
        params.append(max(m.params for m in memory))
        # 1F1B: rank r holds P - r micro-batches: what rank 1 keeps is P - 1 times one micro-batch's
        param_bytes, act_bytes, stream_bytes = request.element_bytes
        step = StepSettings(
            rows_per_rank=1,
            seq=2048,
            recompute=True,
            param_bytes=param_bytes,
            act_bytes=act_bytes,
            stream_bytes=stream_bytes,
        )
        one = memory_per_rank(pipe_rank_shape(shape, p, 1, 1), GridShape(), step)
        assert memory[1].detail["kept"] == pytest.approx((p - 1) * one.detail["kept"])
    assert peaks == sorted(peaks, reverse=True) and params == sorted(params, reverse=True)
    assert params[-1] < params[0] / 6  # the layers' parameters split 8 ways; embeddings and lm_head stay whole


def test_refusals() -> None:
    with pytest.raises(ValueError, match="--pipe 16: more stages than the 8 decoder layers"):
        _request(gpus=16, pipe_sizes=(16,))
    with pytest.raises(ValueError, match="--pipe 3 does not divide --gpus 8"):
        _request(pipe_sizes=(3,))
    with pytest.raises(ValueError, match="--pipe-schedule takes"):
        _request(pipe_schedules=("looped",))
    too_many = plan_grid(_request(pipe_schedules=("interleaved-1f1b",), pipe_virtual=(2,)), GridShape(pipe=8))
    assert not too_many.feasible and too_many.reason == (
        "cannot pipeline: 16 stages for 8 decoder layers; choose at most one stage per layer"
    )
    odd = plan_grid(_request(global_batch=6), GridShape(pipe=2, data=4))  # a stage's 4 GPUs read different rows
    assert not odd.feasible and "not divisible by the GPUs of a stage reading different rows (4)" in odd.reason
    tied = PlanRequest(shape=NAMED_SHAPES["40B"], gpus=16, global_batch=64, seq=2048, profile=PROFILES["dgx-h100"])
    assert tied.pipes == [1]  # the AxoNN GPT sizes tie lm_head to the embeddings
    refused = plan_grid(tied, GridShape(pipe=2, data=8))
    assert not refused.feasible and "input embeddings tied to lm_head" in refused.reason
    neox = PlanRequest(shape=NAMED_SHAPES["NEOX-20B"], gpus=8, global_batch=8, seq=2048, profile=PROFILES["frontier"])
    assert neox.pipes == [1] and "confirmed for llama, qwen2, gpt2 only" in plan_grid(neox, GridShape(pipe=2)).reason
    # a config read from transformers carries the engine's own check
    assert model_planner_shape(tiny_family("llama", vocab=128)).pipeline_refusal == ""
    assert "confirmed for" in model_planner_shape(tiny_family("gpt_neox", vocab=128)).pipeline_refusal


def test_plans_rank_5d_grids() -> None:
    plans = rank_grids(_request())
    assert len(plans) == sum(count_grids(8 // p) for p in (1, 2, 4, 8))
    assert len({p.grid for p in plans}) == len(plans)
    feasible = [p for p in plans if p.feasible]
    assert {p.grid.pipe for p in feasible} == {1, 2, 4, 8}
    assert [p.step_s for p in feasible] == sorted(p.step_s for p in feasible)
    for p in feasible:
        if p.grid.pipe > 1:
            assert p.bubble == pipeline_bubble(p.schedule, p.grid.pipe, p.grad_accum, p.virtual)
            assert p.step_s == pytest.approx(p.compute_s + p.memory_s + p.comm_s + p.bubble_s)
            assert max(p.stage_memory) == p.memory.total <= 80 * GIB * 0.9 and len(p.stage_memory) == p.grid.pipe
    only = rank_grids(_request(pipe_sizes=(1,)))  # --pipe 1: the 4D planner
    assert len(only) == count_grids(8) and all(p.grid.pipe == 1 for p in only)


def test_the_train_command_of_a_pipelined_plan() -> None:
    request = _request(pipe_sizes=(2,), pipe_schedules=("interleaved-1f1b",), microbatches=8)
    plan = plan_grid(request, GridShape(pipe=2, data=4))
    assert plan.feasible and plan.grad_accum == 8 and plan.virtual == 2
    command = train_command(request, plan)
    words = command.split(" goldfish train ")[1].split()
    assert " --grid pipe=2,data=4 " in command and "--grad-accum" not in words
    assert words[words.index("--pipe-schedule") + 1] == "interleaved-1f1b"
    assert words[words.index("--microbatches") + 1] == "8" and words[words.index("--pipe-virtual") + 1] == "2"
    # the engine runs it: each GPU's 64 / 4 = 16 rows per step split into 8 micro-batches, as its checks accept
    PipeConfig(schedule="interleaved-1f1b", virtual=2, microbatches=8).resolve_microbatches(2, 16)
    from goldfish.app.cli import build_parser

    train = build_parser()._subparsers._group_actions[0].choices["train"]
    for plan in (p for p in rank_grids(request) if p.feasible):
        words = train_command(request, plan).split(" goldfish train ")[1].split()
        assert {w for w in words if w.startswith("--")} <= set(train._option_string_actions), words
        args = build_parser().parse_args(["train", *words])
        assert (args.grid, args.pipe_schedule, args.microbatches) == (words[1], plan.schedule, plan.grad_accum)


def test_pipelined_plans_use_only_what_the_engine_runs_with_a_pipe_axis() -> None:
    from engine.training.config import TrainConfig

    for stage in STAGES:
        for rows in ROWS_LAYOUTS:
            config = TrainConfig(batch_size=16, zero=stage, rows=rows, activation_checkpointing=True)
            try:
                config.check_pipeline(GridShape(pipe=2, data=2, x=2))
                runs = True
            except ValueError:
                runs = False
            if stage in PIPE_ZERO_STAGES and rows in PIPE_ROWS_LAYOUTS:
                assert runs, (stage, rows)
    plans = [p for p in rank_grids(_request()) if p.feasible and p.grid.pipe > 1]
    assert plans and all((p.zero.stage if p.zero else 0) in PIPE_ZERO_STAGES for p in plans)


def _llama3_request(**overrides) -> PlanRequest:
    base = dict(
        shape=NAMED_SHAPES["405B"],
        gpus=16384,
        global_batch=2048,  # 16M tokens per step
        seq=8192,
        profile=PROFILES["dgx-h100"],
        pipe_sizes=(16,),
        pipe_schedules=("interleaved-1f1b",),
    )
    base.update(overrides)
    return PlanRequest(**base)


def test_llama3_405b_published_shape() -> None:
    """TP8 (here y=8: x*y*z = 8 inside a node) x PP16 x DP128, 2,048 x 8,192 tokens, interleaved 1F1B."""
    request = _llama3_request()
    plan = plan_grid(request, GridShape(pipe=16, data=128, y=8))
    assert plan.feasible and plan.schedule == "interleaved-1f1b" and plan.virtual == 2
    # the x*y group shares its rows (as Megatron's tensor parallelism does): 2048 / 128 = 16 rows per GPU, one per
    # micro-batch, as Llama 3's batch size per data rank of 16
    assert plan.rows == "shared" and plan.grad_accum == 16 and plan.rows_per_micro_batch == 1
    assert plan.memory.total <= 80 * GIB * 0.9 and len(plan.stage_memory) == 16
    assert plan.bubble == 15 / (2 * 16 + 15)
    # each middle rank sends its 2 stages' hidden states forward and their gradients back: 4 x 16 fp32 messages of
    # 1 x 8,192 x 16,384, plus 15 bytes of the gradient norm's sum over stages
    assert plan.bytes_by_group["pipe"] == 4 * 16 * 8192 * 16384 * 4 + 15
    assert plan.step_s == pytest.approx(plan.compute_s + plan.memory_s + plan.comm_s + plan.bubble_s)
    # below the published 38-43% MFU (no overlap, 50% of peak per product, recomputation), but of its order
    assert 0.1 < plan.mfu < 0.43
    # the same shape without activation checkpointing does not fit: the engine keeps each layer's activations whole
    # on every rank of x*y (no sequence parallelism)
    off = plan_grid(_llama3_request(checkpointing="off"), GridShape(pipe=16, data=128, y=8))
    assert not off.feasible and off.reason.startswith("needs ")
    # 1F1B on the same grid: the bubble (P-1)/(M+P-1) with 16 micro-batches is 15/31
    one = plan_grid(_llama3_request(pipe_schedules=("1f1b",)), GridShape(pipe=16, data=128, y=8))
    assert one.bubble == 15 / 31 and one.step_s > plan.step_s


def test_planner_doc_shows_the_llama3_table_the_planner_computes() -> None:
    text = (ROOT / "docs" / "planner.md").read_text(encoding="utf-8")
    flops = model_flops_per_token(NAMED_SHAPES["405B"], 8192) * 2048 * 8192
    assert "| published | | 16 | 6.72 |" in text and f"{flops / (400e12 * 16384):.2f}" == "6.72"
    settings = [("1f1b", 1, "1F1B")] + [("interleaved-1f1b", v, "interleaved 1F1B") for v in (2, 4)]
    for schedule, v, label in settings:
        request = _llama3_request(pipe_schedules=(schedule,), pipe_virtual=(v,))
        p = plan_grid(request, GridShape(pipe=16, data=128, y=8))
        row = (
            f"| {label} | {v} | {p.grad_accum} | {p.step_s:.2f} | {p.compute_s:.2f} | {p.comm_s:.2f} ({p.p2p_s:.2f}) | "
            f"{p.bubble_s:.2f} ({p.bubble:.1%}) | {p.memory.total / GIB:.1f} | {flops / p.step_s / 16384 / 1e12:.0f} | "
            f"{p.mfu:.1%} |"
        )
        assert row in text, row


@pytest.mark.slow
def test_the_unconstrained_planner_ranks_the_llama3_shape_first(capsys) -> None:
    """What docs/planner.md shows `goldfish plan` print for Llama 3 405B (about 10 s)."""
    text = (ROOT / "docs" / "planner.md").read_text(encoding="utf-8")
    words = " ".join(text.split()).split("`")
    argv = next(w for w in words if w.startswith("goldfish plan --model 405B") and "--top" in w).split()[2:]
    assert plan_main(argv) == 0
    out = capsys.readouterr().out
    for line in out.splitlines():
        assert line in text, line
    row = next(line for line in out.splitlines() if line.startswith("   1 "))
    assert row.split()[1:6] == ["16", "128", "1", "8", "1"]  # pipe 16 x data 128 x tensor 8, as published


@pytest.mark.parametrize(
    "argv, expected",
    [
        ("--pipe 3", "--pipe 3 does not divide --gpus 64; give divisors of the GPU count"),
        ("--gpus 128 --pipe 128", "--pipe 128: more stages than the 80 decoder layers of Llama-2-70B; give at most 80"),
        ("--pipe-virtual 0", "--pipe-virtual takes stage counts >= 1"),
        ("--microbatches 0", "--microbatches must be >= 1"),
        ("--pipe-schedule looped", "--pipe-schedule: invalid choice: 'looped'"),
    ],
)
def test_bad_pipeline_options_are_one_line_exit_2(argv: str, expected: str, capsys) -> None:
    assert_plan_refuses(["--model", "70B", "--gpus", "64", "--profile", "dgx-h100"] + argv.split(), expected, capsys)


def test_goldfish_plan_prints_and_writes_pipelined_plans(tmp_path, capsys) -> None:
    argv = "--model 8B --gpus 16 --profile dgx-h100 --global-batch 64 --pipe 1 8 --pipe-schedule 1f1b --top 40"
    assert plan_main([*argv.split(), "--json", str(tmp_path / "plan.json")]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("rank"))
    assert header.split()[:2] == ["rank", "pipe"] and "schedule" in header and "bubble" in header
    payload = json.loads((tmp_path / "plan.json").read_text())
    assert payload["request"]["pipeline"] == {
        "pipe_sizes": [1, 8],
        "schedules": ["1f1b"],
        "virtual": [2],
        "microbatches": None,
    }
    piped = [g for g in payload["grids"] if g["grid"]["pipe"] == 8 and g["feasible"]]
    assert piped and all(
        g["pipeline"]["schedule"] == "1f1b" and len(g["pipeline"]["stage_memory_gib"]) == 8 for g in piped
    )
    assert len(payload["grids"]) == count_grids(16) + count_grids(2)
    assert plan_main("--model 40B --gpus 16 --profile dgx-h100".split()) == 0  # tied: pipe 1 only, and it says why
    out = capsys.readouterr().out
    assert "pipe 1 only: input embeddings tied to lm_head" in out and "schedule" not in out
