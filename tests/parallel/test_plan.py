"""The planner, its machine profiles, the FLOP/parameter models and `--measure`.

References: parameter counts of real HF models and the published sizes of the named models (exact);
torch's FlopCounterMode on a serial Llama step (exact: both count 2 m n k per matrix product); hand-computed
link bandwidths and collective times; a real 4-rank gloo measurement for `--measure`.
"""

from __future__ import annotations

import argparse
import json
import math

import pytest
import torch
import torch.nn.functional as F
from distributed import run_distributed

from engine.core.grid import GridShape
from engine.models.shape import planner_shape
from engine.planner.cost_model import (
    NAMED_SHAPES,
    StepSettings,
    TransformerShape,
    count_grids,
    grid_fits_shape,
    llama_step_collectives,
    memory_per_rank,
    model_flops_per_token,
    ordered_grids,
    rank_flops_per_step,
)
from engine.planner.plan import PlanRequest, plan_grid, rank_grids, step_prediction
from engine.planner.profiles import PROFILES, MachineProfile, MeasuredCollective, group_stride, load_profile
from goldfish.app.plan import add_plan_arguments, run_plan


def test_grid_enumeration_counts() -> None:
    for world in (1, 2, 4, 8, 12, 30, 64):
        grids = ordered_grids(world)
        assert len(grids) == len({(g.data, g.x, g.y, g.z) for g in grids}) == count_grids(world)
        assert all(g.world_size == world for g in grids)
    assert count_grids(4) == 10 and count_grids(8) == 20
    assert count_grids(32768) == 816  # "for 32K GPUs, there are >800 unique configurations" (AxoNN talk)


def _tiny_llama_config(**overrides):
    from transformers import LlamaConfig

    kwargs = dict(
        hidden_size=64,
        num_attention_heads=8,
        num_key_value_heads=4,
        num_hidden_layers=2,
        vocab_size=96,
        intermediate_size=160,
        max_position_embeddings=64,
    )
    kwargs.update(overrides)
    return LlamaConfig(**kwargs)


@pytest.mark.parametrize("family", ["llama", "llama-bias-tied", "qwen2", "qwen3", "mistral"])
def test_shape_parameter_count_equals_hf_model(family: str) -> None:
    import transformers

    if family == "llama":
        config = _tiny_llama_config()
    elif family == "llama-bias-tied":
        config = _tiny_llama_config(attention_bias=True, mlp_bias=True, tie_word_embeddings=True)
    else:
        name = {"qwen2": "Qwen2Config", "qwen3": "Qwen3Config", "mistral": "MistralConfig"}[family]
        config = getattr(transformers, name)(
            hidden_size=64,
            num_attention_heads=8,
            num_key_value_heads=4,
            num_hidden_layers=2,
            vocab_size=96,
            intermediate_size=160,
            head_dim=8,
            max_position_embeddings=64,
        )
    model = transformers.AutoModelForCausalLM.from_config(config)
    assert planner_shape(config).n_params == sum(p.numel() for p in model.parameters())


def test_named_sizes_match_published_parameter_counts() -> None:
    # parameter counts of the released checkpoints (safetensors index metadata / model cards)
    published = {"7B": 6_738_415_616, "8B": 8_030_261_248, "70B": 68_976_648_192, "405B": 405_853_388_800}
    for name, count in published.items():
        assert NAMED_SHAPES[name].n_params == count, name


def test_flop_model_equals_flop_counter_on_a_serial_step() -> None:
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import LlamaForCausalLM

    config = _tiny_llama_config(attn_implementation="eager")  # explicit matmuls the counter sees
    shape = planner_shape(config)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    rows, seq = 3, 16
    ids = torch.randint(0, 96, (rows, seq))
    with FlopCounterMode(display=False) as counter:
        logits = model(input_ids=ids).logits
        F.cross_entropy(logits.reshape(-1, 96), ids.reshape(-1)).backward()
    predicted = rank_flops_per_step(shape, GridShape(), StepSettings(rows_per_rank=rows, seq=seq), chunked_loss=False)
    # the counter sees the input-embedding lookup as free and so do we; the model's formula matches exactly
    assert counter.get_total_flops() == predicted
    assert predicted == model_flops_per_token(shape, seq) * rows * seq
    # the chunked loss of goldfish train recomputes the logits in backward: 2 more flops per lm_head weight and token
    from engine.core.vocab_parallel import causal_lm_token_losses

    with FlopCounterMode(display=False) as counter:
        causal_lm_token_losses(model, ids, ids).sum().backward()
    head = 2 * rows * seq * shape.vocab * shape.hidden
    chunked = rank_flops_per_step(shape, GridShape(), StepSettings(rows_per_rank=rows, seq=seq))
    assert chunked == predicted + head
    # the counter sees forward, recomputed logits and hidden-state gradient, but not the weight gradient, which
    # the loss accumulates in place (addmm_, an op FlopCounterMode does not count)
    assert counter.get_total_flops() == chunked - head


def test_grid_fits_shape_reasons() -> None:
    shape = NAMED_SHAPES["70B"]  # 64 heads, 8 kv heads
    assert grid_fits_shape(shape, GridShape(x=16, y=8, z=4)) is None
    assert "key/value heads" in grid_fits_shape(shape, GridShape(y=16))
    odd = TransformerShape(hidden=96, layers=1, heads=6, kv_heads=6, intermediate=200, vocab=10)
    assert "in_features" in grid_fits_shape(odd, GridShape(x=64))


def test_link_model_hand_computed() -> None:
    perl, frontier = PROFILES["perlmutter"], PROFILES["frontier"]
    assert perl.link(4, 1)[0] == 100e9  # x group of a whole node: an NVLink ring edge
    assert perl.link(2, 4) == (25e9, perl.inter_latency_s, "network")  # 4 groups share the node's 100 GB/s
    assert perl.link(8, 1)[0] == 100e9  # one ring crossing each node boundary: the NICs' full 100 GB/s
    assert frontier.link(2, 1)[2] == "package" and frontier.link(2, 1)[0] == 200e9
    assert frontier.link(8, 1)[0] == 50e9 and frontier.link(2, 2)[0] == 50e9
    assert frontier.link(2, 8)[0] == 12.5e9  # 8 GCDs share 4 NICs x 25 GB/s
    assert frontier.link(3, 1)[2] == "network"  # a span of 3 straddles packages and nodes
    # time of 10 all-reduces sending 1 GB in total over 4 ranks inside a Perlmutter node
    assert perl.collective_seconds("all_reduce", 4, 1, 1e9, 10) == pytest.approx(10 * 6 * 5e-6 + 1e9 / 100e9)


def test_measured_entries_take_precedence() -> None:
    base = PROFILES["perlmutter"]
    measured = MachineProfile(**{**base.__dict__, "measured": (MeasuredCollective("all_gather", 4, 1, 1e-3, 2.0),)})
    assert measured.collective_seconds("all_gather", 4, 1, 4e9, 2) == pytest.approx(2 * 3 * 1e-3 + 2.0)
    assert measured.collective_seconds("all_reduce", 4, 1, 4e9, 2) == base.collective_seconds(
        "all_reduce", 4, 1, 4e9, 2
    )


def test_group_stride() -> None:
    sizes = {"data": 2, "x": 2, "y": 3, "z": 4}
    assert [group_stride(a, sizes) for a in (("x",), ("y",), ("z",), ("data",))] == [1, 2, 6, 24]
    assert group_stride(("x", "y"), sizes) == 1 and group_stride(("z", "data"), sizes) == 6
    assert group_stride(("x", "z"), {"data": 1, "x": 2, "y": 1, "z": 2}) == 1  # y of size 1 leaves no gap
    with pytest.raises(ValueError, match="contiguous"):
        group_stride(("x", "z"), sizes)


def test_profile_json_round_trip(tmp_path) -> None:
    profile = MachineProfile(
        **{**PROFILES["frontier"].__dict__, "measured": (MeasuredCollective("all_reduce", 2, 1, 1e-5, 10.0),)}
    )
    path = tmp_path / "p.json"
    profile.save(path)
    assert load_profile(str(path)) == profile
    with pytest.raises(ValueError, match="unknown machine profile"):
        load_profile("summit")
    with pytest.raises(ValueError, match="unknown profile fields"):
        MachineProfile.from_json({**profile.to_json(), "nvlink": 1})


def _request(**overrides) -> PlanRequest:
    base = dict(shape=NAMED_SHAPES["7B"], gpus=16, global_batch=64, seq=2048, profile=PROFILES["dgx-h100"])
    base.update(overrides)
    return PlanRequest(**base)


def test_pure_data_parallel_prediction_hand_computed() -> None:
    """data=2 on two DGX nodes (one rank per node): the only traffic is the gradient all-reduce."""
    profile = MachineProfile(**{**PROFILES["dgx-h100"].__dict__, "gpus_per_node": 1})
    shape = TransformerShape(hidden=256, layers=2, heads=4, kv_heads=4, intermediate=512, vocab=1000)
    request = PlanRequest(
        shape=shape, gpus=2, global_batch=8, seq=128, profile=profile, precision="bf16", checkpointing="off"
    )
    plan = step_prediction(request, GridShape(data=2), grad_accum=1)
    # everything is summed over "data" (shards), "z+data" (norms) or "world" (embeddings): 2 ranks each
    sent = 2 * shape.n_params * 4 * (2 - 1) / 2  # fp32 gradients: --precision bf16 is autocast over fp32 weights
    assert sum(plan.bytes_by_group.values()) == sent
    calls = 3  # one bucket per group
    expected_comm = calls * 2 * profile.inter_latency_s + sent / (profile.inter_node_gbps * 1e9)
    assert plan.comm_s == pytest.approx(expected_comm)
    flops = (
        3 * (2 * 4 * 128 * shape.layers * shape.layer_linear_params + 4 * 4 * 128 * 128 * shape.layers * 256)
        + 8 * 4 * 128 * 1000 * 256
    )  # the chunked loss recomputes the logits in backward
    assert plan.compute_s == pytest.approx(flops / (989e12 * 0.5))
    # memory-bound work: 5 passes over each layer's kept activations (norms 2 x (4 + 2) x hidden, the shared
    # q/k/v and gate/up inputs 2 x 2 x hidden, attention 2 x (3 x 4 + 2 x 4) x 64, MLP 2 x 4 x 512 bytes per
    # token) and the logits (2 + 8 bytes each), plus AdamW's 1.75 x 16 bytes per parameter
    per_layer = 512 * (2 * 6 * 256 + 2 * 2 * 256 + 2 * 20 * 64 + 2 * 4 * 512)
    traffic = 5 * (2 * per_layer + 512 * 1000 * 10) + 28 * shape.n_params
    assert plan.memory_s == pytest.approx(traffic / (profile.memory_gbps * 1e9))
    assert plan.step_s == pytest.approx(plan.compute_s + plan.memory_s + plan.comm_s)


def test_planner_ranks_feasible_grids_and_explains_rejections() -> None:
    plans = rank_grids(_request())
    assert len(plans) == sum(count_grids(16 // p) for p in (1, 2, 4, 8, 16))  # every pipe size dividing 16 GPUs
    feasible = [p for p in plans if p.feasible]
    assert feasible and all(p.memory.total <= 80 * 1024**3 * 0.9 for p in feasible)
    times = [p.step_s for p in feasible]
    assert times == sorted(times)
    assert all(p.reason for p in plans if not p.feasible)
    # more GPUs in z shard the parameters further: less parameter memory
    mem = [
        memory_per_rank(
            NAMED_SHAPES["7B"], GridShape(data=16 // z, z=z), StepSettings(rows_per_rank=1, seq=2048)
        ).params
        for z in (1, 2, 4, 8, 16)
    ]
    assert mem == sorted(mem, reverse=True)


def test_planner_rejections() -> None:
    tiny_memory = MachineProfile(**{**PROFILES["dgx-h100"].__dict__, "gpu_memory_gib": 1.0})
    assert not any(p.feasible for p in rank_grids(_request(profile=tiny_memory)))
    plan = plan_grid(_request(global_batch=24), GridShape(data=16))
    assert not plan.feasible and "not divisible" in plan.reason
    plan = plan_grid(_request(grad_accum=3), GridShape(data=16))
    assert not plan.feasible and "micro-batches" in plan.reason
    with pytest.raises(ValueError, match="compute_efficiency"):
        _request(compute_efficiency=1.5)


def test_checkpointing_choice_trades_memory_for_time() -> None:
    grid = GridShape(data=2, z=8)
    off = plan_grid(_request(checkpointing="off", grad_accum=1), grid)
    on = plan_grid(_request(checkpointing="on", grad_accum=1), grid)
    assert on.recompute and not off.recompute
    assert on.memory.activations < off.memory.activations and on.compute_s > off.compute_s
    assert sum(on.bytes_by_group.values()) > sum(off.bytes_by_group.values())  # forward collectives again


def test_autocast_moves_fp32_weights_and_bf16_products() -> None:
    """--precision bf16 is autocast as in goldfish train: the weights (z traffic) stay fp32 as under fp32, while
    the x/y products are bf16; a pure-bf16 model (not something the engine trains) would halve the z bytes."""
    grid = GridShape(data=2, x=2, z=4)
    fp32 = step_prediction(_request(precision="fp32", checkpointing="off"), grid, grad_accum=4)
    mixed = step_prediction(_request(precision="bf16", checkpointing="off"), grid, grad_accum=4)
    assert (
        mixed.bytes_by_group["z"] == fp32.bytes_by_group["z"] and mixed.bytes_by_group["x"] < fp32.bytes_by_group["x"]
    )

    def forward_x(p: tuple[int, int, int]) -> int:
        step = StepSettings(rows_per_rank=1, seq=2048, param_bytes=p[0], act_bytes=p[1], stream_bytes=p[2])
        collectives = llama_step_collectives(NAMED_SHAPES["7B"], grid, step)
        return sum(c.sent_bytes for c in collectives if c.group == "x" and c.phase == "forward")

    assert forward_x((4, 2, 4)) == forward_x((2, 2, 2))


def _cli(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_plan_arguments(parser)
    return parser.parse_args(argv)


def test_run_plan_prints_table_and_writes_json(tmp_path, capsys) -> None:
    out = tmp_path / "plan.json"
    assert run_plan(_cli(["--model", "70B", "--gpus", "256", "--profile", "frontier", "--json", str(out)])) == 0
    text = capsys.readouterr().out
    assert "Llama-2-70B" in text and "step s" in text and "rank" in text
    payload = json.loads(out.read_text())
    assert len(payload["grids"]) == sum(count_grids(256 // p) for p in (1, 2, 4, 8, 16, 32, 64))  # pipe <= 80 layers
    first = payload["grids"][0]
    assert first["feasible"] and first["step_s"] > 0 and first["memory_gib"]["total"] <= 64 * 0.9
    assert payload["request"]["profile"]["name"] == "frontier"


def test_run_plan_reads_a_config_folder(tmp_path, capsys) -> None:
    _tiny_llama_config().save_pretrained(tmp_path / "cfg")
    assert (
        run_plan(
            _cli(
                [
                    "--model",
                    str(tmp_path / "cfg"),
                    "--gpus",
                    "8",
                    "--seq-len",
                    "64",
                    "--global-batch",
                    "16",
                    "--gpus-per-node",
                    "4",
                ]
            )
        )
        == 0
    )
    assert "8 GPUs on perlmutter (4 per node" in capsys.readouterr().out


def test_run_plan_errors() -> None:
    with pytest.raises(ValueError, match="--model and --gpus"):
        run_plan(_cli(["--gpus", "8"]))
    with pytest.raises(ValueError, match="cannot read a model config"):
        run_plan(_cli(["--model", "/nonexistent/folder", "--gpus", "8"]))
    with pytest.raises(ValueError, match="unknown machine profile"):
        run_plan(_cli(["--model", "7B", "--gpus", "8", "--profile", "summit"]))


def _measure_worker() -> dict | None:
    from engine.planner.measure import measure_profile

    profile = measure_profile(PROFILES["perlmutter"], small_bytes=1 << 10, large_bytes=1 << 16, iters=2, gemm_size=64)
    return None if profile is None else profile.to_json()


def test_measure_writes_a_usable_profile(tmp_path) -> None:
    results = run_distributed(4, _measure_worker)
    assert results[1:] == [None, None, None]
    profile = MachineProfile.from_json(results[0])
    shapes = {(m.kind, m.ranks, m.stride) for m in profile.measured}
    assert shapes == {
        (k, p, s)
        for k in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
        for p, s in ((2, 1), (2, 2), (4, 1))
    }
    assert all(m.gbps > 0 and m.latency_s > 0 for m in profile.measured)
    assert profile.gpus_per_node == 4 and profile.peak_tflops > 0
    assert profile.inter_node_gbps == PROFILES["perlmutter"].inter_node_gbps  # one node: not measured
    path = tmp_path / "measured.json"
    profile.save(path)
    request = PlanRequest(
        shape=TransformerShape(hidden=64, layers=2, heads=8, kv_heads=8, intermediate=128, vocab=128),
        gpus=4,
        global_batch=8,
        seq=32,
        profile=load_profile(str(path)),
        precision="fp32",
    )
    plans = rank_grids(request)
    assert len(plans) == 10 + 4 and all(p.feasible and math.isfinite(p.step_s) for p in plans)  # pipe 1 and 2


def test_step_collectives_scale_with_micro_batches() -> None:
    shape, grid = NAMED_SHAPES["7B"], GridShape(data=2, x=2, y=2, z=2)
    one = llama_step_collectives(shape, grid, StepSettings(rows_per_rank=2, seq=128, grad_accum=1))
    four = llama_step_collectives(shape, grid, StepSettings(rows_per_rank=2, seq=128, grad_accum=4))
    per_pass = lambda cs: sum(c.sent_bytes for c in cs if c.phase in ("forward", "backward"))  # noqa: E731
    once = lambda cs: sum(c.sent_bytes for c in cs if c.phase in ("sync", "clip"))  # noqa: E731
    assert per_pass(four) == 4 * per_pass(one) and once(four) == once(one)


@pytest.mark.slow
def test_mfu_bench_runs_on_cpu(tmp_path) -> None:
    """bench/mfu.py end to end on a tiny model: both paths start from the same weights and batch."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "mfu.json"
    subprocess.run(
        [
            sys.executable,
            str(root / "bench" / "mfu.py"),
            "--seq",
            "16",
            "--batch",
            "2",
            "--steps",
            "1",
            "--rounds",
            "1",
            "--warmup",
            "1",
            "--threads",
            "1",
            "--out",
            str(out),
        ],
        check=True,
        cwd=root,
        capture_output=True,
        timeout=300,
    )
    result = json.loads(out.read_text())
    paths = result["paths"]
    assert paths["engine"]["first_loss"] == paths["plain"]["first_loss"]
    assert all(p["tokens_per_s"] > 0 and 0 < p["mfu"] for p in paths.values())


def test_run_plan_exits_non_zero_when_no_grid_fits(capsys) -> None:
    assert run_plan(_cli(["--model", "70B", "--gpus", "1", "--profile", "frontier"])) == 1
    captured = capsys.readouterr()
    assert "(no grid fits)" in captured.out
    assert captured.err.count("\n") == 1 and "goldfish plan: error: no grid of 1 GPUs fits" in captured.err
    assert "Fix: more --gpus" in captured.err
    assert "the planner's estimate: at least" in captured.err and "GiB per GPU" in captured.err


def test_axonn_gpt_shapes_count_the_parameters_of_a_gpt_model() -> None:
    """The GPT layout of the AxoNN named sizes (no gate, biases, LayerNorm, tied embeddings) counts what a GPT-2
    model of the same sizes holds, less its learned position embeddings."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from engine.planner.cost_model import _axonn_gpt

    config = GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=50304, n_positions=32)
    model = GPT2LMHeadModel(config)
    shape = _axonn_gpt(2, 64, 4, "tiny")
    assert shape.n_params == sum(p.numel() for p in model.parameters()) - 32 * 64
    for name, nominal in (("40B", 40e9), ("60B", 60e9), ("80B", 80e9), ("320B", 320e9), ("640B", 640e9)):
        assert 0.9 < NAMED_SHAPES[name].n_params / nominal < 1.0, name  # nominal sizes, rounded up


def test_plans_are_goldfish_train_options() -> None:
    """Every choice of a plan is an option of `goldfish train` (precision and rows values included); a batch that
    does not divide by the world size is planned in the shared rows layout (--rows shared) when it divides by
    data*z, and refused with the reason when neither layout splits it."""
    from engine.planner.plan import PRECISIONS, train_command
    from goldfish.app.cli import build_parser

    train = build_parser()._subparsers._group_actions[0].choices["train"]
    flags = {s for action in train._actions for s in action.option_strings}
    precision = next(a for a in train._actions if "--precision" in a.option_strings)
    assert set(PRECISIONS) == set(precision.choices)
    plans = [p for p in rank_grids(_request(pipe_sizes=(1,))) if p.feasible]  # (pipelined plans: test_plan_pipe)
    assert any(p.zero is not None for p in plans) and any(p.recompute for p in plans)
    for plan in plans:
        command = train_command(_request(), plan).split(" goldfish train ")[1].split()
        assert {w for w in command if w.startswith("--")} <= flags, command
    rows = next(a for a in train._actions if "--rows" in a.option_strings)
    from engine.planner.cost_model import ROWS_LAYOUTS

    assert set(ROWS_LAYOUTS) == set(rows.choices)
    shared = plan_grid(_request(gpus=16, global_batch=24), GridShape(data=2, x=8))
    assert shared.feasible and shared.rows == "shared" and shared.rows_per_micro_batch * shared.grad_accum == 12
    command = train_command(_request(gpus=16, global_batch=24), shared)
    assert (
        "--rows shared" in command
        and {w for w in command.split(" goldfish train ")[1].split() if w.startswith("--")} <= flags
    )
    rejected = plan_grid(_request(gpus=16, global_batch=24), GridShape(data=16))  # data*z = world: no layout splits
    assert not rejected.feasible and "multiple of the world size" in rejected.reason
    own_only = plan_grid(_request(gpus=16, global_batch=24, rows_layouts=("own",)), GridShape(data=2, x=8))
    assert not own_only.feasible and "--rows shared" in own_only.reason
    # both layouts split 32 rows: the shared one drops the row gathers around the decoder (x+y traffic) and wins
    both = plan_grid(_request(global_batch=32), GridShape(data=2, x=8))
    own = plan_grid(_request(global_batch=32, rows_layouts=("own",)), GridShape(data=2, x=8))
    assert both.rows == "shared" and both.step_s < own.step_s and own.rows == "own"
