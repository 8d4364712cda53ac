"""LoRA through peft: targets checked against the model, merged checkpoint loads in plain transformers and
computes what the adapted model computes, tensor-parallel grids refused. About 5 s."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("peft", reason="needs the lora extra: pip install -e '.[lora]'")

from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig  # noqa: E402

from goldfish import causal_targets, drop_mask, goldfish_loss  # noqa: E402
from goldfish.app.lora import (ADAPTER_DIR, LoraSpec, apply_lora, check_grid, load_adapter_weights,  # noqa: E402
                               merged_model, save_lora)


def tiny_llama() -> torch.nn.Module:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64,
                         tie_word_embeddings=False)
    return AutoModelForCausalLM.from_config(config)


def test_unknown_targets_name_the_modules_that_exist() -> None:
    with pytest.raises(ValueError, match="c_attn: LlamaForCausalLM has no Linear layer of that name; its Linear "
                                         "layers are down_proj,gate_proj,k_proj,lm_head,o_proj,q_proj,up_proj,v_proj"):
        apply_lora(tiny_llama(), LoraSpec(rank=4, targets=("q_proj", "c_attn")))
    gpt2 = AutoModelForCausalLM.from_config(GPT2Config(vocab_size=96, n_embd=32, n_layer=1, n_head=2, n_positions=64))
    with pytest.raises(ValueError, match="its Linear layers are c_attn,c_fc,c_proj,lm_head"):
        apply_lora(gpt2, LoraSpec(rank=4, targets=("q_proj",)))


def test_bad_specs_and_tensor_parallel_grids_are_refused() -> None:
    with pytest.raises(ValueError, match="--lora-rank must be an integer >= 1"):
        LoraSpec(rank=0)
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
    torch.testing.assert_close(merged_model(model).state_dict()["model.layers.0.self_attn.q_proj.weight"],
                               plain.state_dict()["model.layers.0.self_attn.q_proj.weight"])

    # the adapter reloads into a fresh LoRA model of the same spec (what --resume does)
    again = apply_lora(tiny_llama(), LoraSpec(rank=4, alpha=8, targets=("q_proj", "v_proj")), seed=5)
    load_adapter_weights(again, tmp_path / "ckpt")
    with torch.no_grad():
        torch.testing.assert_close(again.eval()(input_ids=ids).logits, adapted)
