"""Sharding verification (engine/training/verify.py) and the miniature it builds (engine/models/miniature.py)."""

from __future__ import annotations

import pytest
import torch
from distributed import run_distributed
from tiny_models import tiny_family

from engine.core.grid import init
from engine.core.linear import ShardingError
from engine.models.families import known_families
from engine.models.family import FamilyAdapter
from engine.models.miniature import MINI_HEAD_DIM, miniature_config
from engine.training.verify import Verification, parallelize, verify_sharding


def tiny_codegen() -> torch.nn.Module:
    from transformers import CodeGenConfig, CodeGenForCausalLM

    config = CodeGenConfig(vocab_size=96, n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=64)
    torch.manual_seed(0)
    return CodeGenForCausalLM(config)


def _verify_worker() -> list[str]:
    grid = init(y=2)
    seen = []
    try:
        result = verify_sharding(tiny_family("llama", vocab=64), grid)
        assert isinstance(result, Verification) and result.family == "llama" and result.seconds < 60
        seen.append("llama verified")
        with pytest.raises(ShardingError, match="^codegen: .*qkv_proj looks like a fused projection"):
            parallelize(tiny_codegen(), grid, verify=True)  # the static rule refuses before anything runs
        seen.append("codegen refused by the plan")
        # The rule the engine had before: CodeGen's qkv_proj taken as [q | k | v]. The miniature must catch it.
        wrong = FamilyAdapter(model_type="codegen", fused={"qkv_proj": "blocks"})
        with pytest.raises(ShardingError, match="^codegen: the engine cannot shard .* differs from one process"):
            verify_sharding(tiny_codegen(), grid, families=(*known_families(), wrong))
        seen.append("wrong order caught")
    finally:
        grid.close()
    return seen


def test_verification_passes_a_right_sharding_and_catches_a_wrong_one() -> None:
    expected = ["llama verified", "codegen refused by the plan", "wrong order caught"]
    assert run_distributed(2, _verify_worker) == [expected] * 2


def test_nothing_to_verify_without_tensor_parallelism() -> None:
    grid = init(data=1)
    try:
        assert verify_sharding(tiny_family("llama", vocab=64), grid) is None
    finally:
        grid.close()


def test_miniature_keeps_heads_and_switches_and_shrinks_the_rest() -> None:
    from transformers import Gemma3TextConfig, LlamaConfig

    real = LlamaConfig(vocab_size=32000, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8)
    mini = miniature_config(real, shards=4)
    assert (mini.num_attention_heads, mini.num_key_value_heads) == (32, 8)  # divisibility by y as the real model's
    assert mini.num_hidden_layers == 2 and mini.hidden_size == 32 * MINI_HEAD_DIM
    assert mini.intermediate_size == 11008 * MINI_HEAD_DIM // 128
    assert mini.vocab_size % 4 == 0 and mini.vocab_size < 1000  # divisible by the shards, as 32000 is
    assert miniature_config(LlamaConfig(vocab_size=32001), shards=4).vocab_size % 4 != 0
    assert real.hidden_size == 4096 and real.num_hidden_layers == 32  # the real config is untouched
    gemma = Gemma3TextConfig(num_hidden_layers=12, sliding_window_pattern=6)
    kinds = miniature_config(gemma).layer_types
    assert len(kinds) == 2 and set(kinds) == set(gemma.layer_types)  # one layer of each kind


@pytest.mark.slow
def test_goldfish_train_on_a_tiny_codegen_equals_one_process_or_refuses(tmp_path) -> None:
    """x=2 splits no heads, so CodeGen's fused qkv_proj is exact there (losses within float32 reordering, ~1e-7
    relative per step: rel=1e-5); y=2 would split it by an unconfirmed order and is refused in one line, exit 2."""
    import json
    import subprocess
    import sys

    from data.documents import default_corpus
    from data.tokenizer import train_bpe_tokenizer
    from goldfish.app.cli import main

    tokenizer = train_bpe_tokenizer((d.text for d in default_corpus()), vocab_size=400)
    from transformers import CodeGenConfig, CodeGenForCausalLM

    config = CodeGenConfig(vocab_size=len(tokenizer), n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=64)
    torch.manual_seed(0)
    CodeGenForCausalLM(config).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    common = ["--model", str(tmp_path / "model"), "--n-train", "4", "--n-heldout", "2", "--seq-len", "32"]
    common += ["--epochs", "2", "--batch-size", "2", "--optimizer", "sgd", "--lr", "0.1", "--no-progress"]

    def launch(grid: str, out: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "goldfish", "train", "--nproc", "2", "--grid", grid, "--out", out, *common]
        return subprocess.run(command, capture_output=True, text=True, timeout=600)

    refused = launch("y=2", str(tmp_path / "y2"))
    assert refused.returncode == 2
    errors = [line for line in refused.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "codegen" in errors[0] and "qkv_proj" in errors[0], refused.stderr[-2000:]
    done = launch("x=2", str(tmp_path / "x2"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "sharding of codegen verified" in done.stdout + done.stderr
    assert main(["train", "--out", str(tmp_path / "serial"), *common]) == 0
    losses = [
        [json.loads(line)["loss"] for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
        for run in ("x2", "serial")
    ]
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
