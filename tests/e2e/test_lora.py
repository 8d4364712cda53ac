"""LoRA through peft: targets checked against the model, merged checkpoint loads in plain transformers and
computes what the adapted model computes, tensor-parallel grids refused. About 5 s."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_runs import tiny_run

pytest.importorskip("peft", reason="needs the lora extra: pip install -e '.[lora]'")

from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig  # noqa: E402

from goldfish import causal_targets, drop_mask, goldfish_loss  # noqa: E402
from goldfish.app.lora import (  # noqa: E402
    ADAPTER_DIR,
    LoraSpec,
    apply_lora,
    check_grid,
    load_adapter_weights,
    merged_model,
    save_lora,
)


def tiny_llama() -> torch.nn.Module:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    return AutoModelForCausalLM.from_config(config)


def test_unknown_targets_name_the_modules_that_exist() -> None:
    with pytest.raises(
        ValueError,
        match="c_attn: LlamaForCausalLM has no Linear layer of that name; its Linear "
        "layers are down_proj,gate_proj,k_proj,lm_head,o_proj,q_proj,up_proj,v_proj",
    ):
        apply_lora(tiny_llama(), LoraSpec(rank=4, targets=("q_proj", "c_attn")))
    gpt2 = AutoModelForCausalLM.from_config(GPT2Config(vocab_size=96, n_embd=32, n_layer=1, n_head=2, n_positions=64))
    with pytest.raises(ValueError, match="its Linear layers are c_attn,c_fc,c_proj,lm_head"):
        apply_lora(gpt2, LoraSpec(rank=4, targets=("q_proj",)))


def test_bad_specs_and_tensor_parallel_grids_are_refused() -> None:
    with pytest.raises(ValueError, match="--lora-rank must be an integer >= 1"):
        LoraSpec(rank=-1)
    assert not LoraSpec().enabled and LoraSpec(rank=2, targets="q_proj, v_proj").targets == ("q_proj", "v_proj")
    with pytest.raises(ValueError, match="--lora-alpha must be > 0"):
        LoraSpec(rank=2, alpha=0)
    with pytest.raises(ValueError, match="LoRA runs on the data axis only.*x=2.*Use --grid data=N"):
        check_grid({"data": 1, "x": 2})
    check_grid({"data": 4})  # fine


def test_lora_trains_adapters_only_and_the_merged_checkpoint_loads_in_plain_transformers(tmp_path: Path) -> None:
    base = tiny_llama()
    before = {k: v.clone() for k, v in base.state_dict().items()}
    ids = torch.randint(3, 96, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        base_logits = base(input_ids=ids).logits
    model = apply_lora(base, LoraSpec(rank=4, alpha=8, targets=("q_proj", "v_proj")), seed=0)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_A" in n or "lora_B" in n for n in trainable)
    assert len(trainable) == 2 * 2 * 2  # 2 layers x (q_proj, v_proj) x (A, B)

    targets = causal_targets(ids)
    dropped = drop_mask(targets, "hashed", 4, 13)
    with torch.no_grad():
        untouched = model(input_ids=ids).logits
    torch.testing.assert_close(untouched, base_logits, rtol=0, atol=0)  # B = 0: it starts as the base model
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    for _ in range(3):
        optimizer.zero_grad()
        goldfish_loss(model(input_ids=ids).logits, targets, dropped).loss.backward()
        optimizer.step()

    model.eval()
    with torch.no_grad():
        adapted = model(input_ids=ids).logits
    assert not torch.allclose(adapted, untouched)  # the adapters moved
    for key, value in model.get_base_model().state_dict().items():
        if "lora_" not in key and "base_layer" not in key:
            torch.testing.assert_close(value, before[key])  # base weights frozen

    save_lora(model, tmp_path / "ckpt", lambda plain, folder: plain.save_pretrained(folder))
    assert (tmp_path / "ckpt" / ADAPTER_DIR / "adapter_config.json").is_file()
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt").eval()
    assert not any("lora" in k for k in plain.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(plain(input_ids=ids).logits, adapted, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        merged_model(model).state_dict()["model.layers.0.self_attn.q_proj.weight"],
        plain.state_dict()["model.layers.0.self_attn.q_proj.weight"],
    )

    # the adapter reloads into a fresh LoRA model of the same spec (what --resume does)
    again = apply_lora(tiny_llama(), LoraSpec(rank=4, alpha=8, targets=("q_proj", "v_proj")), seed=5)
    load_adapter_weights(again, tmp_path / "ckpt")
    with torch.no_grad():
        torch.testing.assert_close(again.eval()(input_ids=ids).logits, adapted)


# ----- the application: goldfish train / compare --lora-rank ------------------------------------------------------

SMALL = tiny_run(n_train=8, n_heldout=4, seq_len=32, vocab_size=None, batch_size=8, lr="1e-2")


def test_goldfish_train_lora_checkpoint_is_merged_and_resumes_exactly(tmp_path: Path) -> None:
    """`goldfish train --lora-rank`: the checkpoint is the merged model (plain transformers loads it and computes
    what the trained LoRA model computes), the adapter sits next to it, and a resumed run repeats the loss of an
    uninterrupted one exactly."""
    import json

    import engine.training.train as engine_train
    from goldfish.app.cli import main
    from goldfish.app.config import DataSpec, MaskSpec, TrainSpec
    from goldfish.app.training import train_model

    out = tmp_path / "full"
    assert (
        main(
            ["train", "--out", str(out), "--epochs", "4", "--lora-rank", "4", "--lora-targets", "q_proj,v_proj", *SMALL]
        )
        == 0
    )
    expected = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert expected[-1]["loss"] < expected[0]["loss"]
    record = json.loads((out / "checkpoint" / "goldfish_run.json").read_text())
    assert record["lora"] == {"rank": 4, "alpha": None, "targets": ["q_proj", "v_proj"]}
    assert (out / "checkpoint" / ADAPTER_DIR / "adapter_model.safetensors").is_file()
    plain = AutoModelForCausalLM.from_pretrained(out / "checkpoint")
    assert not any("lora" in key for key in plain.state_dict())

    spec = TrainSpec(
        model="micro-llama",
        data=DataSpec(n_train=8, n_heldout=4, seq_len=32),
        mask=MaskSpec("hashed", 4, 13),
        train=engine_train.TrainConfig(epochs=4, batch_size=8, lr=1e-2, save_every=2, progress=False),
        lora=LoraSpec(rank=4, targets=("q_proj", "v_proj")),
    )

    class Interrupted(Exception):
        pass

    def stop_after_two(model: torch.nn.Module, epoch: int, step: int) -> None:
        if epoch == 2:
            raise Interrupted

    with pytest.raises(Interrupted):
        train_model(spec, tmp_path / "cut", log=lambda *a: None, on_epoch_end=stop_after_two)
    merged, prepared = train_model(
        spec, tmp_path / "cut", log=lambda *a: None, resume_from=tmp_path / "cut" / "checkpoint"
    )
    resumed = [json.loads(line) for line in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in resumed] == [r["loss"] for r in expected]
    ids = torch.tensor([prepared.split.train[0].token_ids])
    with torch.no_grad():  # the merged model returned for evaluation = the checkpoint plain transformers loads
        torch.testing.assert_close(
            merged(input_ids=ids).logits, plain.eval()(input_ids=ids).logits, rtol=1e-5, atol=1e-5
        )


def test_lora_bad_targets_and_tensor_parallel_grid_fail_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from goldfish.app.cli import main

    assert main(["train", "--out", str(tmp_path / "a"), "--lora-rank", "4", "--lora-targets", "c_attn", *SMALL]) == 2
    assert (
        "its Linear layers are down_proj,gate_proj,k_proj,lm_head,o_proj,q_proj,up_proj,v_proj"
        in capsys.readouterr().err
    )
    assert (
        main(["train", "--out", str(tmp_path / "b"), "--lora-rank", "4", "--nproc", "2", "--grid", "x=2", *SMALL]) == 2
    )
    assert "LoRA runs on the data axis only" in capsys.readouterr().err
    assert (
        main(
            [
                "train",
                "--out",
                str(tmp_path / "c"),
                "--lora-rank",
                "4",
                "--zero",
                "1",
                "--nproc",
                "2",
                "--grid",
                "data=2",
                *SMALL,
            ]
        )
        == 2
    )
    assert "--lora-rank with --zero 1 is not supported" in capsys.readouterr().err
    assert not (tmp_path / "a" / "checkpoint").exists() and not (tmp_path / "b").exists()
    assert not (tmp_path / "c").exists()


def test_compare_full_vs_lora(tmp_path: Path) -> None:
    """compare --lora-rank --with-full trains standard and goldfish models both ways from the same weights and
    evaluates the merged LoRA models."""
    import json

    from goldfish.app.cli import main

    out = tmp_path / "cmp"
    assert (
        main(
            [
                "compare",
                "--out",
                str(out),
                *tiny_run(
                    n_heldout=4,
                    seq_len=32,
                    vocab_size=None,
                    epochs=2,
                    batch_size=4,
                    suffix_len=8,
                    curve_every=0,
                    lora_rank=4,
                    with_full=True,
                ),
            ]
        )
        == 0
    )
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["models"]) == [
        "control",
        "standard",
        "goldfish-hashed-k4-h13",
        "lora-r4-standard",
        "lora-r4-goldfish-hashed-k4-h13",
    ]
    assert [r["lora"] is not None for r in summary["config"]["runs"]] == [False, False, True, True]
    assert set(summary["membership"]) >= {"lora-r4-standard", "lora-r4-goldfish-hashed-k4-h13"}
    AutoModelForCausalLM.from_pretrained(out / "lora-r4-goldfish-hashed-k4-h13" / "checkpoint")
