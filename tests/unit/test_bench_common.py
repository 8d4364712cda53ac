"""bench/common.py: the options, the Llama builder, the training step and the result writer the benchmarks share."""

import argparse
import importlib.util
import json
from pathlib import Path

import pytest
import torch

# bench/ is not a package (its scripts run as `python bench/x.py`): load the file itself
_spec = importlib.util.spec_from_file_location(
    "bench_common", Path(__file__).resolve().parents[2] / "bench" / "common.py"
)
common = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(common)


def test_options_take_the_scripts_defaults_and_reject_bad_values(capsys) -> None:
    parser = argparse.ArgumentParser()
    common.add_options(parser, help={"steps": "measured steps per copy"}, hidden=96, layers=3, steps=5, threads=None)
    args = common.parse(parser, ["--layers", "2"])
    assert (args.hidden, args.layers, args.steps, args.threads) == (96, 2, 5, None)
    assert common.model_shape(args) == {"hidden": 96, "layers": 2}
    assert "measured steps per copy" in parser.format_help()
    with pytest.raises(SystemExit):
        common.parse(parser, ["--steps", "0"])
    assert "must be >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no shared bench option"):
        common.add_options(argparse.ArgumentParser(), batch=8)


def test_build_llama_is_seeded_and_maps_the_shape() -> None:
    shape = dict(vocab=64, hidden=32, layers=1, heads=4, seq=16)
    a, b = common.build_llama(**shape), common.build_llama(**shape)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    other = common.build_llama(**shape, seed=1)
    assert not torch.equal(a.lm_head.weight, other.lm_head.weight)
    config = common.build_llama(**shape, kv_heads=2, intermediate=48, pad_token_id=0).config
    assert (
        config.vocab_size,
        config.hidden_size,
        config.num_hidden_layers,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.intermediate_size,
        config.max_position_embeddings,
        config.pad_token_id,
    ) == (64, 32, 1, 4, 2, 48, 16, 0)
    assert a.config.num_key_value_heads == 4 and a.config.intermediate_size == 128


def test_train_step_is_one_sgd_step_on_the_mean_next_token_loss() -> None:
    model = common.build_llama(vocab=64, hidden=32, layers=1, heads=4, seq=16)
    reference = common.build_llama(vocab=64, hidden=32, layers=1, heads=4, seq=16)
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    loss = common.train_step(model, torch.optim.SGD(model.parameters(), lr=0.1), ids, max_norm=1e9)
    logits = reference(input_ids=ids).logits
    expected = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 64), ids[:, 1:].reshape(-1))
    expected.backward()
    assert torch.allclose(loss, expected.detach())
    with torch.no_grad():
        for p, q in zip(model.parameters(), reference.parameters()):
            assert torch.allclose(p, q - 0.1 * q.grad, atol=1e-6)


def test_write_result_records_the_command_and_writes_strict_json(tmp_path) -> None:
    path = common.write_result(
        tmp_path / "r" / "out.json", {"ratio": 1.5, "never": float("inf")}, ["--steps", "2", "a b"]
    )
    result = json.loads(path.read_text())
    assert result["command"].endswith("--steps 2 'a b'") and result["ratio"] == 1.5 and result["never"] == "inf"
    assert list(result) == ["command", "ratio", "never"]


def test_median_seconds_and_timed() -> None:
    calls = []
    assert common.median_seconds(lambda: calls.append(1), repeats=3, warmup=2) >= 0
    assert len(calls) == 5
    value, seconds = common.timed(lambda: 7)
    assert value == 7 and seconds >= 0
