"""Experiment wiring: mask specs, examples, the loss hook (random masks redrawn per step), labels."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from data import TokenizedDocument
from data.batch import Batch
from goldfish.app.config import MaskSpec, parse_mask
from goldfish.app.training_rows import make_examples, make_step_loss
from goldfish.masks import causal_targets, drop_mask


def _docs(n=4, length=40):
    generator = torch.Generator().manual_seed(0)
    return [
        TokenizedDocument(
            id=f"d{i}",
            text="",
            token_ids=[0] + torch.randint(3, 200, (length - 1,), generator=generator).tolist(),
            sha256="",
        )
        for i in range(n)
    ]


def test_parse_mask_and_labels():
    assert parse_mask("standard").label == "standard"
    assert parse_mask("hashed:4:13") == MaskSpec("hashed", 4, 13)
    assert parse_mask("static:3").label == "goldfish-static-k3"
    assert parse_mask("hashed-reference:4:13").label == "goldfish-hashed-reference-k4-h13"
    for bad in ("hashed:x", "hashed:4:13:2", "nope:4"):
        with pytest.raises(ValueError):
            parse_mask(bad)
    with pytest.raises(ValueError, match="k must be"):
        MaskSpec("hashed", 1)
    with pytest.raises(ValueError, match="h "):
        MaskSpec("hashed", 4, 0)


def test_examples_carry_the_drop_mask_of_their_targets():
    docs = _docs()
    examples = make_examples(docs, MaskSpec("hashed", 4, 13), special_token_ids=[0, 1, 2])
    for doc, example in zip(docs, examples):
        targets = causal_targets(torch.tensor([doc.token_ids]))[0]
        assert torch.equal(example.targets, targets)
        assert torch.equal(example.dropped, drop_mask(targets, "hashed", 4, 13, special_token_ids=[0, 1, 2]))
    standard = make_examples(docs, MaskSpec(None), special_token_ids=[])
    assert not any(e.dropped.any() for e in standard)


def test_random_mask_is_redrawn_every_step_and_reproducible():
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=256,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            intermediate_size=64,
            max_position_embeddings=64,
        )
    )
    docs = _docs(n=2, length=400)
    mask = MaskSpec("random", 4)
    examples = make_examples(docs, mask, special_token_ids=[])
    loss_fn = make_step_loss(mask, special_token_ids=[])

    def kept_count(step):
        batch = Batch.stack(examples, torch.tensor([0, 1]), step, torch.device("cpu"))
        return loss_fn(model, batch).n_tokens

    counts = [kept_count(step) for step in range(4)]
    assert counts[0] == kept_count(0)  # same step, same draw (resume reproduces it)
    assert len(set(counts)) > 1  # a different draw on each occurrence
    n_targets = 2 * 399
    assert all(abs(c / n_targets - 0.75) < 0.08 for c in counts)  # 5 sigma of Binomial(798, 1/4) is ~0.077


def test_repeats_copy_documents_round_robin_with_identical_hashed_masks():
    from goldfish.app.config import DataSpec, parse_repeats

    docs = _docs(n=5)
    spec = DataSpec(repeats=parse_repeats("1,3"))
    repeats = spec.repeats_by_id(docs)
    assert repeats == {"d0": 1, "d1": 3, "d2": 1, "d3": 3, "d4": 1}
    examples = make_examples(docs, MaskSpec("hashed", 4, 13), special_token_ids=[0], repeats=repeats)
    assert len(examples) == 1 + 3 + 1 + 3 + 1
    copies = examples[1:4]  # the three copies of d1
    for copy in copies:
        assert torch.equal(copy.input_ids, torch.tensor(docs[1].token_ids))
        assert torch.equal(copy.dropped, copies[0].dropped)  # hashed: same tokens, same drops
    # The random strategy draws a separate mask for every copy (what makes it fail on repeated text).
    random_examples = make_examples(docs, MaskSpec("random", 2), special_token_ids=[0], repeats=repeats)
    assert not torch.equal(random_examples[1].dropped, random_examples[2].dropped)


@pytest.mark.parametrize("bad", ["0", "1,x", "", "2,-1"])
def test_bad_repeats_are_refused(bad):
    from goldfish.app.config import parse_repeats

    with pytest.raises(ValueError, match="repeats"):
        parse_repeats(bad)


def test_instrument_settings_are_validated():
    from goldfish.app.config import Instruments

    assert Instruments(beams=30, samples=10, top_p=0.9).sampling().n_samples == 10
    for bad, match in (
        ({"beams": 1}, "beams"),
        ({"samples": -1}, "samples"),
        ({"temperature": 0}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"prefix_lengths": (0,)}, "prefix"),
    ):
        with pytest.raises(ValueError, match=match):
            Instruments(**bad)
