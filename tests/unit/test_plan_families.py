"""`goldfish plan` for every family the engine shards: the shape engine.models.shape reads off a transformers model
(from the plan engine.parallelize shards it by) against the model itself and the named shapes, and the command on a
folder or config.json of a tiny GPT-NeoX, Phi-3 or OLMo2. The bytes it predicts for those families are checked
against the engine's counters in tests/parallel/test_comm_model.py."""

from __future__ import annotations

import json

import pytest
from tiny_models import PLANNED_FAMILIES, tiny_family

from engine.models.shape import model_planner_shape, planner_shape
from engine.planner.cost_model import (
    NAMED_SHAPES,
    StepSettings,
    TransformerShape,
    bytes_by_group,
    grid_fits_shape,
    llama_step_collectives,
    local_params,
    memory_per_rank,
    ordered_grids,
)
from engine.spec import GridShape, ZeroConfig
from goldfish.app.plan import main

VOCAB = 128


@pytest.mark.parametrize("family", PLANNED_FAMILIES)
def test_the_read_shape_holds_the_parameters_of_the_model(family: str) -> None:
    """Every parameter once, in the layout the engine gives it; built on the meta device from the config, the same."""
    model = tiny_family(family, vocab=VOCAB)
    shape = model_planner_shape(model)
    assert shape.n_params == sum(p.numel() for p in model.parameters())
    assert shape.layers == 2 and shape.vocab == VOCAB and shape.hidden == 32
    assert planner_shape(model.config) == shape
    # the loss goldfish train runs: from the logits where the model changes them after its head (or the head has a
    # bias), else the chunked loss
    assert shape.logits_loss == (family in ("gemma2", "cohere", "cohere_qk_norm", "granite", "phi"))


def test_a_llama_config_reads_as_the_llama_layout_of_the_fields() -> None:
    """The read layout and TransformerShape's own Llama layout give the same parameters, bytes and memory."""
    model = tiny_family("llama", vocab=VOCAB)
    config = model.config
    fields = TransformerShape(  # the cost model's own Llama layout, from the config's numbers
        hidden=config.hidden_size,
        layers=config.num_hidden_layers,
        heads=config.num_attention_heads,
        kv_heads=config.num_key_value_heads,
        intermediate=config.intermediate_size,
        vocab=config.vocab_size,
        head_dim=config.head_dim,
        tie_embeddings=config.tie_word_embeddings,
        qkv_bias=config.attention_bias,
        o_bias=config.attention_bias,
        mlp_bias=config.mlp_bias,
    )
    read = model_planner_shape(model)
    zero = ZeroConfig(stage=1)
    for grid in ordered_grids(8):
        assert local_params(read, grid) == local_params(fields, grid)
        grid_zero = zero if grid.data > 1 else None
        for rows in ("own", "shared"):
            step = StepSettings(rows_per_rank=2, seq=16, rows=rows)
            assert bytes_by_group(llama_step_collectives(read, grid, step, zero=grid_zero)) == bytes_by_group(
                llama_step_collectives(fields, grid, step, zero=grid_zero)
            )
        step = StepSettings(rows_per_rank=2, seq=16)
        assert memory_per_rank(read, grid, step) == memory_per_rank(fields, grid, step)


def test_gpt_neox_20b_read_from_its_config_against_the_named_shape() -> None:
    """transformers' default GPTNeoXConfig is GPT-NeoX-20B: read on the meta device (no 20B weights allocated), it
    holds the named `neox-20b` shape's parameters and moves the same parameter bytes (z, data); its fused per-head
    query_key_value, one projection where the named GPT layout has three, moves fewer activation bytes over x and y."""
    from transformers import GPTNeoXConfig

    read, named = planner_shape(GPTNeoXConfig()), NAMED_SHAPES["NEOX-20B"]
    assert read.n_params == named.n_params == 20_554_567_680
    zero, step = ZeroConfig(stage=3), StepSettings(rows_per_rank=1, seq=2048)
    assert bytes_by_group(llama_step_collectives(read, GridShape(data=48, z=8), step, zero=zero)) == (
        bytes_by_group(llama_step_collectives(named, GridShape(data=48, z=8), step, zero=zero))
    )
    grid = GridShape(data=4, x=2, y=2, z=2)
    fused = bytes_by_group(llama_step_collectives(read, grid, step))
    separate = bytes_by_group(llama_step_collectives(named, grid, step))
    assert all(fused[g] == separate[g] for g in ("z", "data", "z+data")) and all(fused[g] < separate[g] for g in "xy")


def test_grids_the_engine_refuses_are_refused_with_its_reason() -> None:
    """Heads a y rank cannot split evenly, and a fused projection whose order the engine has not confirmed (CodeGen's
    qkv_proj): y > 1 refused with the engine's own message, every other grid planned."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from engine.models.miniature import miniature_config

    olmo2 = model_planner_shape(tiny_family("olmo2", vocab=VOCAB))  # 4 heads, 2 key/value heads
    assert "key/value heads not divisible by y=4" in grid_fits_shape(olmo2, GridShape(y=4))
    assert grid_fits_shape(olmo2, GridShape(x=2, y=2, z=2)) is None
    codegen = planner_shape(miniature_config(CONFIG_MAPPING["codegen"](), shards=2))
    assert "looks like a fused projection" in grid_fits_shape(codegen, GridShape(y=2))
    assert grid_fits_shape(codegen, GridShape(x=2, z=2)) is None


def _plan(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("family", ["gpt_neox", "phi3", "olmo2"])
def test_goldfish_plan_ranks_grids_for_a_folder_of_the_family(family: str, tmp_path, capsys) -> None:
    folder = tmp_path / family
    tiny_family(family, vocab=VOCAB).config.save_pretrained(folder)
    out = tmp_path / "plan.json"
    args = ["--gpus", "8", "--seq-len", "64", "--global-batch", "16", "--top", "30", "--json", str(out)]
    code, text, err = _plan(["--model", str(folder), *args], capsys)
    assert code == 0 and err == "" and "20 grids:" in text and f"{family}:" in text
    grids = json.loads(out.read_text())["grids"]
    feasible = [g for g in grids if g["feasible"]]
    assert [g["step_s"] for g in feasible] == sorted(g["step_s"] for g in feasible)
    sizes = [(g["grid"]["x"], g["grid"]["y"], g["grid"]["z"]) for g in feasible]
    assert (2, 2, 2) in sizes  # x, y and z together
    refused = {(g["grid"]["x"], g["grid"]["y"], g["grid"]["z"]): g["reason"] for g in grids if not g["feasible"]}
    assert "heads not divisible by y=8" in refused[(1, 8, 1)]
    # the config.json itself plans the same
    code, again, _ = _plan(["--model", str(folder / "config.json"), *args], capsys)
    assert code == 0 and again.splitlines()[1:] == text.splitlines()[1:]


def test_goldfish_plan_refuses_a_model_the_engine_cannot_plan_in_one_line(tmp_path, capsys) -> None:
    """A mixture-of-experts family (data parallelism only in the engine) is refused before any planning, exit 2."""
    tiny_family("mixtral", vocab=VOCAB).config.save_pretrained(tmp_path / "moe")
    code, out, err = _plan(["--model", str(tmp_path / "moe"), "--gpus", "8"], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("goldfish plan: error: mixtral:") and "mixture-of-experts" in err
