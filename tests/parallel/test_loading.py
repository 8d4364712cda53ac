"""Sharded loading (engine/training/loading.py): equal to parallelize(from_pretrained(folder)) on every grid tried,
reading
only each rank's slices. Llama with biases and tied embeddings saved as several safetensors files; GPT-2 (fused,
regrouped c_attn; Conv1D layout) as one file."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from distributed import run_distributed
from tiny_models import tiny_gpt2, tiny_llama

from engine.core.grid import init
from engine.models.parallelize import parallelize
from engine.training.loading import LoadingError, load_sharded
from engine.training.state import full_state_dict

VOCAB = 128
SHAPES = [(1, 2, 2, 1), (1, 1, 2, 2), (2, 1, 1, 2)]


def make_folders(tmp) -> dict[str, str]:
    llama = tiny_llama(vocab=VOCAB, tied=True)
    gpt2 = tiny_gpt2(vocab=VOCAB, seed=1, dropout=0.1)
    folders = {}
    for name, model in (("llama", llama), ("gpt2", gpt2)):
        folders[name] = f"{tmp}/{name}"
        model.save_pretrained(folders[name], max_shard_size="100KB" if name == "llama" else "1GB")
    return folders


def _worker(folders: dict[str, str]) -> int:
    from transformers import AutoModelForCausalLM

    checked = 0
    ids = torch.randint(0, VOCAB, (8, 6), generator=torch.Generator().manual_seed(1))
    for shape in SHAPES:
        data, x, y, z = shape
        grid = init(data=data, x=x, y=y, z=z)
        try:
            mine = ids[grid.rank * 2 : (grid.rank + 1) * 2]
            for name, folder in folders.items():
                serial = AutoModelForCausalLM.from_pretrained(folder)
                reference = parallelize(copy.deepcopy(serial), grid)
                model = load_sharded(folder, grid)
                for (key, a), (key_b, b) in zip(reference.state_dict().items(), model.state_dict().items()):
                    assert key == key_b and torch.equal(a, b), (shape, name, key)  # the same shards
                if name == "llama":
                    assert model.lm_head.weight is model.model.embed_tokens.weight  # still tied
                full = full_state_dict(model, grid)
                for key, value in serial.state_dict().items():
                    assert torch.equal(full[key], value), (shape, name, key)
                with torch.no_grad():
                    torch.testing.assert_close(
                        model(input_ids=mine).logits, reference(input_ids=mine).logits, rtol=0, atol=0
                    )
                checked += 1
        finally:
            grid.close()
    return checked


def test_sharded_loading_equals_parallelize_of_from_pretrained(tmp_path) -> None:
    folders = make_folders(tmp_path)
    assert json.loads((tmp_path / "llama" / "model.safetensors.index.json").read_text())["weight_map"]
    assert run_distributed(4, _worker, folders) == [2 * len(SHAPES)] * 4


def test_bad_folders(tmp_path) -> None:
    folders = make_folders(tmp_path)
    grid = init()
    try:
        with pytest.raises(LoadingError, match="no model.safetensors"):
            load_sharded(tmp_path, grid)
        config = json.loads((tmp_path / "gpt2" / "config.json").read_text())
        config["n_layer"] = 3  # the files hold 2 layers
        (tmp_path / "gpt2" / "config.json").write_text(json.dumps(config))
        with pytest.raises(LoadingError, match="lack .* tensors"):
            load_sharded(folders["gpt2"], grid)
    finally:
        grid.close()


def _family_worker(folders: dict[str, str], shape: tuple[int, int, int, int]) -> list[str]:
    """Each family's folder loaded sharded equals from_pretrained: full state (buffers included) and logits."""
    from transformers import AutoModelForCausalLM

    ids = torch.randint(0, VOCAB, (4, 6), generator=torch.Generator().manual_seed(2))
    grid = init(data=shape[0], x=shape[1], y=shape[2], z=shape[3])
    done = []
    try:
        mine = ids[grid.rank * 2 : (grid.rank + 1) * 2]
        for family, folder in folders.items():
            serial = AutoModelForCausalLM.from_pretrained(folder).eval()
            model = load_sharded(folder, grid)
            full = full_state_dict(model, grid)
            for key, value in serial.state_dict().items():
                assert torch.equal(full[key], value), (family, key)
            for name, buffer in serial.named_buffers():
                assert torch.equal(model.get_buffer(name), buffer), (family, name)  # recomputed, not stored
            with torch.no_grad():
                torch.testing.assert_close(model(input_ids=mine).logits, serial(input_ids=mine).logits)
            done.append(family)
    finally:
        grid.close()
    return done


# Families whose saved names differ from the model's (GPT-NeoX's head is stored as embed_out.weight) or whose
# non-persistent buffers are not rotary tables (Gemma's embedding scale), and a fused family.
LOADED_FAMILIES = ("gpt_neox", "gemma", "gemma2", "gemma3_text", "phi3")


def test_families_with_renamed_heads_and_computed_buffers_load_sharded(tmp_path) -> None:
    """Logits compare with the default tolerance: the sharded products sum in another order (float32)."""
    from tiny_models import tiny_family

    folders = {}
    for family in LOADED_FAMILIES:
        folders[family] = str(tmp_path / family)
        tiny_family(family, vocab=VOCAB, seed=3).save_pretrained(folders[family])
    assert run_distributed(2, _family_worker, folders, (1, 1, 2, 1)) == [list(LOADED_FAMILIES)] * 2


def _verified_worker(folder: str) -> tuple[int, bool]:
    """load_sharded with verify=True on x=2: how many verification reports, and whether its shards equal the load
    without the check."""
    grid = init(x=2)
    try:
        reports: list = []
        checked = load_sharded(folder, grid, verify=True, report=reports.append)
        plain = load_sharded(folder, grid)
        same = all(torch.equal(a, b) for a, b in zip(checked.state_dict().values(), plain.state_dict().values()))
        return len(reports), same
    finally:
        grid.close()


def test_verified_sharded_loading_runs_the_check(tmp_path) -> None:
    """verify=True runs the miniature's check (forward and backward: outside load_sharded's no_grad) and reports it
    once per rank, on a tensor-parallel grid, and loads the same shards."""
    tiny_llama(vocab=VOCAB).save_pretrained(tmp_path)
    assert run_distributed(2, _verified_worker, str(tmp_path)) == [(1, True)] * 2
