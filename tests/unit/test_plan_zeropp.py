"""The planner with ZeRO++: hierarchies sized from the profile, qwZ and qgZ, the Frontier 20B comparison.

References: bytes and seconds per level computed by hand for a three-level qwZ + qgZ setting on a small model (the
engine's measured bytes equal the cost model's: tests/parallel/test_zero.py); the GPT-NeoX-20B parameter count of
transformers' own model; the numbers of docs/planner.md recomputed from bench/zeropp_frontier.py.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from plan_refusals import assert_plan_refuses

from engine.core.grid import GridShape
from engine.planner.cost_model import NAMED_SHAPES, StepSettings, TransformerShape, memory_per_rank
from engine.planner.plan import HIERARCHIES, PlanRequest, plan_grid, rank_grids, step_prediction, train_command
from engine.planner.profiles import PROFILES
from goldfish.app.plan import main as plan_main

ROOT = Path(__file__).resolve().parents[2]
WG = ("weights", "gradients")


def _request(**overrides) -> PlanRequest:
    base = dict(
        shape=NAMED_SHAPES["7B"],
        gpus=64,
        global_batch=64,
        seq=2048,
        profile=PROFILES["frontier"],
        zero_stages=(3,),
        hierarchies=HIERARCHIES,
        quantize=((), WG),
        gradient_bits=4,
    )
    base.update(overrides)
    return PlanRequest(**base)


def test_hierarchy_levels_come_from_the_profile_package_and_node() -> None:
    request = _request()
    # data slowest: a node of 8 GCDs holds 8 / (x*y*z) data ranks, a package of 2 holds 2 / (x*y*z)
    assert request.hierarchy_levels(GridShape(data=64), "package,node") == (8, (2,))
    assert request.hierarchy_levels(GridShape(data=64), "node") == (8, ())
    assert request.hierarchy_levels(GridShape(data=64), "off") == (1, ())
    assert request.hierarchy_levels(GridShape(data=32, y=2), "package,node") == (4, ())  # tp fills the package
    assert request.hierarchy_levels(GridShape(data=4, y=16), "package,node") == (1, ())  # tp spans nodes: flat
    zeros = request.zero_configs(GridShape(data=32, y=2), 3)
    assert len(zeros) == 4  # off and node, each unquantized and quantized: package,node is node here, counted once
    assert [(z.node_size, z.inner_levels, z.quantized) for z in zeros] == [
        (1, (), False),
        (1, (), True),
        (4, (), False),
        (4, (), True),
    ]
    assert [z.stage for z in request.zero_configs(GridShape(data=64), 1)] == [1]  # stage 1 has no levels


def test_three_level_qwz_qgz_bytes_and_seconds_per_level_hand_computed() -> None:
    """data=16 on frontier (nodes of 8 GCDs, packages of 2): levels of 2 (the package), 4 (the packages of a node)
    and 2 (the nodes). A Llama of hidden 64, 2 layers, 4 heads, MLP 128, vocabulary 256 (untied)."""
    shape = TransformerShape(hidden=64, layers=2, heads=4, kv_heads=4, intermediate=128, vocab=256)
    request = _request(shape=shape, gpus=16, global_batch=16, seq=32, hierarchies=("package,node",), quantize=(WG,))
    grid = GridShape(data=16)
    (zero,) = request.zero_configs(grid, 3)
    assert (zero.node_size, zero.inner_levels, zero.level_sizes(16)) == (8, (2,), (2, 4, 2))
    plan = step_prediction(request, grid, grad_accum=1, zero=zero)

    def int8(n: int) -> int:  # qwZ: blocks of 256 int8 codes and a 4-byte scale each
        return -(-n // 256) * (256 + 4)

    def int4(n: int) -> int:  # qgZ at 4 bits: 128 bytes of codes per block
        return -(-n // 256) * (128 + 4)

    # one rank's shard of a layer over 16: q, k, v, o 64 rows / 16 x 64; gate, up 128 / 16 x 64; down 64 / 16 x 128;
    # two norms 64 / 16; of the root: embeddings and lm_head 256 / 16 x 64, the final norm 4
    layer, root = 4 * 4 * 64 + 2 * 8 * 64 + 4 * 128 + 2 * 4, 2 * 16 * 64 + 4
    assert (layer, root) == (2568, 2052)
    # hpZ: the secondary shard over the node of 8, in fp32 (bf16 autocast keeps fp32 weights)
    secondary = 4 * (4 * 8 * 64 + 2 * 16 * 64 + 8 * 128 + 2 * 8)
    level = {1: 0, 2: 0, 3: 0}
    for chunk, calls, regather in ((layer, 2, True), (root, 1, False)):
        p = int8(chunk)
        # forward gather, outermost first: level 3 sends 1 shard, level 2 three of 2, level 1 one of 8
        level[3] += calls * p
        level[2] += calls * 3 * 2 * p
        level[1] += calls * 8 * p
        if regather:  # backward: the secondary partition over the node's levels, level 2 then level 1
            level[2] += calls * 3 * secondary
            level[1] += calls * 4 * secondary
        # qgZ, innermost first: level 1 sends the peer's half, level 2 three quarters of that half, level 3 half of it
        level[1] += calls * int4(16 * chunk // 2)
        level[2] += calls * 3 * int4(16 * chunk // 8)
        level[3] += calls * int4(16 * chunk // 16)
    assert level == {1: 258796, 2: 194988, 3: 12152}
    assert {g: plan.bytes_by_group[f"data.level{g}"] for g in level} == level
    # seconds: level 1 inside a package (200 GB/s), level 2 the packages of a node 2 ranks apart (50 GB/s), level 3
    # across nodes 8 ranks apart: 8 GCDs share the node's 100 GB/s; calls: 3 forward gathers, 2 backward ones on
    # levels 1 and 2, 3 all-to-alls; one step per call and member beyond the first
    f = PROFILES["frontier"]
    assert plan.comm_s_by_group["data.level1"] == pytest.approx(8 * 1 * f.intra_latency_s + level[1] / 200e9)
    assert plan.comm_s_by_group["data.level2"] == pytest.approx(8 * 3 * f.intra_latency_s + level[2] / 50e9)
    assert plan.comm_s_by_group["data.level3"] == pytest.approx(6 * 1 * f.inter_latency_s + level[3] / 12.5e9)
    # quantization keeps no less resident memory: the gathered weights are full precision
    plain = replace(zero, quantize_weights=False, quantize_gradients=False, gradient_bits=8)
    step = StepSettings(rows_per_rank=1, seq=32, act_bytes=2, param_bytes=4)
    assert memory_per_rank(shape, grid, step, zero=zero) == memory_per_rank(shape, grid, step, zero=plain)


def test_all_to_all_across_nodes_shares_the_nics_among_every_gpu() -> None:
    frontier = PROFILES["frontier"]
    # a flat ring over 16 consecutive GCDs crosses each node boundary once: the NICs' 100 GB/s, capped at 50
    assert frontier.link(16, 1)[0] == 50e9
    # an all-to-all over the same ranks sends nearly all of every GCD's bytes off the node: 100 / 8 GB/s each
    assert frontier.link(16, 1, "all_to_all")[0] == 12.5e9
    assert frontier.link(2, 8, "all_to_all") == frontier.link(2, 8)  # one rank per node: the ring's share
    assert frontier.link(4, 2, "all_to_all") == frontier.link(4, 2)  # inside a node: the same links
    seconds = frontier.collective_seconds("all_to_all", 16, 1, 1e9, 2)
    assert seconds == pytest.approx(2 * 15 * frontier.inter_latency_s + 1e9 / 12.5e9)


def test_a_measured_all_to_all_across_nodes_counts_every_gpu_of_the_node() -> None:
    """--measure fits the node's NIC bandwidth from groups that cross nodes: a ring of stride s shares it with s - 1
    other rings, an all-to-all with every other GPU of the node."""
    from engine.planner.measure import fit_profile
    from engine.planner.profiles import MeasuredCollective

    def inter(entry: MeasuredCollective) -> float:
        fitted = fit_profile(
            PROFILES["perlmutter"], [entry], world=8, gpus_per_node=4, peak_tflops=1.0, memory_gib=1.0, memory_gbps=1.0
        )
        return fitted.inter_node_gbps

    assert inter(MeasuredCollective("all_to_all", 8, 1, 1e-5, 5.0)) == 20.0  # 4 GPUs x 5 GB/s each
    assert inter(MeasuredCollective("all_gather", 8, 1, 1e-5, 5.0)) == 5.0  # one ring edge leaves the node
    assert inter(MeasuredCollective("all_gather", 2, 4, 1e-5, 5.0)) == 20.0  # 4 rings of stride 4


def test_the_planner_weighs_hierarchies_and_quantization_per_grid() -> None:
    """On a pinned grid the plan with every option offered is the fastest of the plans with one option each, and on
    Frontier at data=64 that is the three-level qwZ + qgZ setting."""
    grid = GridShape(data=64)
    best = plan_grid(_request(), grid)
    singles = {
        (h, q): plan_grid(_request(hierarchies=(h,), quantize=(q,), gradient_bits=4 if q else 8), grid)
        for h in HIERARCHIES
        for q in ((), WG)
    }
    assert best.step_s == min(p.step_s for p in singles.values())
    assert best.zero == singles["package,node", WG].zero
    assert (best.zero.inner_levels, best.zero.node_size, best.zero.gradient_bits) == ((2,), 8, 4)
    # each cut helps here: quantization at every level, then the package level beneath the node
    assert singles["off", ()].step_s > singles["node", WG].step_s > singles["package,node", WG].step_s
    assert "--zero 3 --zero-hierarchy 2,8 --zero-quantize weights,gradients --zero-quantize-bits 4" in train_command(
        _request(), best
    )
    # every grid is ranked, each with its own best setting
    plans = [p for p in rank_grids(_request()) if p.feasible and p.zero is not None]  # (data=1: no ZeRO)
    assert {(p.zero.node_size > 1, bool(p.zero.inner_levels), p.zero.quantized) for p in plans} >= {
        (False, False, True),
        (True, True, True),
    }


def test_zeropp_plans_are_goldfish_train_options() -> None:
    from goldfish.app.cli import build_parser

    train = build_parser()._subparsers._group_actions[0].choices["train"]
    flags = {s for action in train._actions for s in action.option_strings}
    request = _request(quantize_block=128, pipe_sizes=(1,))  # (pipelined plans: tests/unit/test_plan_pipe.py)
    plans = [p for p in rank_grids(request) if p.feasible and p.zero is not None]
    assert any(p.zero.inner_levels for p in plans)
    for plan in plans:
        words = train_command(request, plan).split(" goldfish train ")[1].split()
        assert {w for w in words if w.startswith("--")} <= flags, words
        if plan.zero.node_size > 1:  # as train's --zero-hierarchy reads it: level sizes, innermost first
            value = words[words.index("--zero-hierarchy") + 1]
            assert tuple(map(int, value.split(","))) == (*plan.zero.inner_levels, plan.zero.node_size)
        assert words[words.index("--zero-quantize-block") + 1] == "128"


def test_goldfish_plan_prints_levels_and_quantization(tmp_path, capsys) -> None:
    argv = "--model 7B --gpus 64 --profile frontier --global-batch 64 --seq-len 2048 --zero 3 "
    argv += "--zero-hierarchy off node package,node --zero-quantize none weights,gradients --zero-quantize-bits 4"
    assert plan_main([*argv.split(), "--json", str(tmp_path / "plan.json")]) == 0
    out = capsys.readouterr().out
    payload = json.loads((tmp_path / "plan.json").read_text())
    assert payload["request"]["zero"] == {
        "stages": [3],
        "hierarchies": ["off", "node", "package,node"],
        "quantize": ["none", "weights,gradients"],
        "gradient_bits": 4,
        "quantize_block": 256,
    }
    data64 = next(g for g in payload["grids"] if g["grid"] == {"pipe": 1, "data": 64, "x": 1, "y": 1, "z": 1})
    assert data64["zero"]["inner_levels"] == [2] and data64["zero"]["node_size"] == 8
    header = next(line for line in out.splitlines() if line.startswith("rank"))
    assert "levels quant" in header
    assert re.search(r"^\s+\d+\s+1\s+64\s+1\s+1\s+1\s+own\s+3\s+2,8\s+w\+g4\s", out, re.M)  # data=64: three levels
    assert "data.level3" in out and "--zero-quantize weights,gradients --zero-quantize-bits 4" in out
    assert plan_main("--model 7B --gpus 64 --profile frontier --global-batch 64 --seq-len 2048".split()) == 0
    assert "levels" not in capsys.readouterr().out  # without ZeRO++ options the table is as before


@pytest.mark.parametrize(
    "argv, expected",
    [
        ("--zero 0 1 --zero-quantize weights", "--zero considers only 0, 1; add --zero 3 (or 2)"),
        ("--zero 1 --zero-hierarchy node", "--zero-hierarchy partitions ZeRO stages 2 and 3"),
        ("--zero-quantize-bits 6", "--zero-quantize-bits: invalid choice: 6"),
        ("--zero-quantize-bits 4 --zero-quantize weights", "add --zero-quantize gradients"),
        ("--zero-quantize int2", "ZeRO++ quantization takes weights, gradients or weights,gradients"),
        ("--zero-hierarchy rack", "--zero-hierarchy: invalid choice: 'rack'"),
        ("--zero-hierarchy package,node --profile perlmutter", "use --zero-hierarchy node, or a profile with"),
        ("--zero-hierarchy node --gpus-per-node 1", "needs nodes of 2 or more GPUs"),
        ("--zero-quantize gradients --zero-quantize-block 7", "--zero-quantize-block must be an even number"),
    ],
)
def test_bad_zeropp_combinations_are_one_line_exit_2(argv: str, expected: str, capsys) -> None:
    assert_plan_refuses(["--model", "7B", "--gpus", "64", "--profile", "frontier"] + argv.split(), expected, capsys)


def test_neox_20b_shape_counts_the_parameters_of_transformers_model() -> None:
    """The `neox-20b` shape holds what transformers' GPTNeoXForCausalLM holds with GPTNeoXConfig's defaults, which
    are GPT-NeoX-20B's published sizes (built on the meta device: no memory)."""
    import torch
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    config = GPTNeoXConfig()
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads, config.vocab_size) == (
        44,
        6144,
        64,
        50432,
    )
    with torch.device("meta"):
        model = GPTNeoXForCausalLM(config)
    assert NAMED_SHAPES["NEOX-20B"].n_params == sum(p.numel() for p in model.parameters()) == 20_554_567_680


def test_planner_doc_shows_what_bench_zeropp_frontier_prints() -> None:
    """docs/planner.md's Frontier ZeRO++ table: each row's step time, communication, Tflop/s per GCD and gain are
    what bench/zeropp_frontier.py computes."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import zeropp_frontier
    finally:
        sys.path.remove(str(ROOT / "bench"))
    text = (ROOT / "docs" / "planner.md").read_text(encoding="utf-8")
    rows = zeropp_frontier.compare()
    assert [r["setting"] for r in rows] == ["ZeRO-3", "ZeRO++", "three levels"] * 2
    for r in rows:
        gain = "-" if r["gain_over_previous"] is None else f"{r['gain_over_previous']:.2f}x"
        cells = (
            f"| {r['rows_per_gcd']} | {r['setting']} | {r['step_s']:.2f} | {r['comm_s']:.2f} | "
            f"{r['tflops_per_gcd']:.1f} | {gain} |"
        )
        assert cells in text, cells
        options = r["command"].split(" --precision bf16 ")[1]
        if r["plan"]["checkpointing"]:  # the doc says which rows add it
            assert r["rows_per_gcd"] == 4 and options.startswith("--activation-checkpointing ")
            options = options.removeprefix("--activation-checkpointing ")
        assert f"`{options}`" in text, options
    # the bytes per GCD and step the doc quotes (1 row per GCD; the same at 4: ZeRO-3 has one micro-batch)
    sent = {r["setting"]: r["plan"]["bytes_by_group"] for r in rows if r["rows_per_gcd"] == 1}
    three = sent["three levels"]
    quoted = (
        f"ZeRO-3 sends {sum(sent['ZeRO-3'].values()) / 1e9:.1f} GB over the 384-rank data ring. ZeRO++ sends "
        f"{sum(sent['ZeRO++'].values()) / 1e9:.1f} GB, of which {sent['ZeRO++']['data.level2'] / 1e9:.1f} GB leave "
        f"the node; three levels send the same bytes across nodes and move {three['data.level1'] / 1e9:.1f} "
        f"GB of the node's traffic onto the 200 GB/s package link ({three['data.level2'] / 1e9:.1f} GB"
    )
    assert quoted in " ".join(text.split())
    assert sent["ZeRO++"]["data.level2"] == sent["three levels"]["data.level3"]


def test_planner_doc_shows_what_goldfish_plan_prints_for_the_frontier_20b(capsys) -> None:
    text = (ROOT / "docs" / "planner.md").read_text(encoding="utf-8")
    command = next(line for line in text.split("\n\n") if line.startswith("`goldfish plan --model neox-20b"))
    argv = " ".join(command.split()).split("`")[1].split()[2:]
    assert plan_main(argv) == 0
    for line in capsys.readouterr().out.splitlines():
        assert line in text, line
