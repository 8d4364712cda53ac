"""goldfish.loss.goldfish_loss and goldfish.collator.GoldfishCollator against hand computations.

Tolerances: losses are float32 sums of a few hundred terms computed in a different order than the
reference expression, so they agree to about 1e-6 relative; we allow 1e-5. Gradients likewise.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from conventions import IGNORE_INDEX
from goldfish.collator import GoldfishCollator
from goldfish.loss import GoldfishLoss, goldfish_loss
from goldfish.masks import STRATEGIES, causal_targets, drop_mask

B, T, V = 3, 17, 11


def batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, T, V) logits, (B, T) targets with some ignored, (B, T) drop mask hitting some ignored too."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, V, generator=generator)
    targets = torch.randint(0, V, (B, T), generator=generator)
    targets[0, -4:] = IGNORE_INDEX
    targets[2, 5] = IGNORE_INDEX
    dropped = torch.rand(B, T, generator=generator) < 0.3
    dropped[0, -1] = True  # a dropped flag on an ignored target must not count anywhere
    return logits, targets, dropped


def test_loss_equals_cross_entropy_on_kept_subset() -> None:
    logits, targets, dropped = batch()
    result = goldfish_loss(logits, targets, dropped)
    valid = targets != IGNORE_INDEX
    kept = valid & ~dropped
    dropped_valid = valid & dropped
    assert isinstance(result, GoldfishLoss)
    assert result.n_kept == int(kept.sum()) and result.n_all == int(valid.sum())
    assert result.n_dropped == int(dropped_valid.sum()) and result.n_kept + result.n_dropped == result.n_all
    torch.testing.assert_close(result.loss, F.cross_entropy(logits[kept], targets[kept]), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        result.loss_sum, F.cross_entropy(logits[kept], targets[kept], reduction="sum"), rtol=1e-5, atol=1e-6
    )
    torch.testing.assert_close(result.all_loss, F.cross_entropy(logits[valid], targets[valid]), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        result.dropped_loss, F.cross_entropy(logits[dropped_valid], targets[dropped_valid]), rtol=1e-5, atol=1e-6
    )
    assert not result.all_loss.requires_grad and not result.dropped_loss.requires_grad


def test_none_mask_is_the_standard_loss() -> None:
    logits, targets, _ = batch(1)
    result = goldfish_loss(logits, targets, None)
    standard = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=IGNORE_INDEX)
    torch.testing.assert_close(result.loss, standard, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(result.all_loss, standard, rtol=1e-5, atol=1e-6)
    assert result.n_dropped == 0 and math.isnan(result.dropped_loss.item())


def test_low_precision_logits_are_scored_in_float32() -> None:
    logits, targets, dropped = batch(2)
    low = logits.to(torch.bfloat16)
    result = goldfish_loss(low, targets, dropped)
    assert result.loss.dtype == torch.float32
    kept = (targets != IGNORE_INDEX) & ~dropped
    # Same bf16 values upcast first: the float32 computation, exactly up to summation order.
    torch.testing.assert_close(result.loss, F.cross_entropy(low.float()[kept], targets[kept]), rtol=1e-5, atol=1e-6)


def test_gradient_flows_only_from_kept_positions() -> None:
    logits, targets, dropped = batch(3)
    logits.requires_grad_(True)
    goldfish_loss(logits, targets, dropped).loss.backward()
    kept = (targets != IGNORE_INDEX) & ~dropped
    assert torch.count_nonzero(logits.grad[~kept]) == 0  # dropped and ignored: exactly zero
    assert (logits.grad[kept].abs().sum(dim=-1) > 0).all()
    reference = logits.detach().clone().requires_grad_(True)
    F.cross_entropy(reference[kept], targets[kept]).backward()
    torch.testing.assert_close(logits.grad, reference.grad, rtol=1e-5, atol=1e-7)


def test_nothing_kept_gives_zero_loss_with_a_graph() -> None:
    logits, targets, _ = batch(4)
    logits.requires_grad_(True)
    result = goldfish_loss(logits, targets, torch.ones(B, T, dtype=torch.bool))
    assert result.n_kept == 0 and result.loss.item() == 0.0 and result.loss.requires_grad
    result.loss.backward()
    assert torch.count_nonzero(logits.grad) == 0
    all_ignored = torch.full((B, T), IGNORE_INDEX)
    empty = goldfish_loss(logits, all_ignored, None)
    assert empty.loss.item() == 0.0 and math.isnan(empty.all_loss.item()) and empty.n_all == 0


def test_loss_rejects_mismatched_inputs() -> None:
    logits, targets, dropped = batch()
    with pytest.raises(ValueError, match=r"must be \(B, T, V\)"):
        goldfish_loss(logits[0], targets, dropped)
    with pytest.raises(ValueError, match="targets shape"):
        goldfish_loss(logits, targets[:, 1:], dropped)
    with pytest.raises(ValueError, match="bool mask"):
        goldfish_loss(logits, targets, dropped.long())
    with pytest.raises(ValueError, match="dropped shape"):
        goldfish_loss(logits, targets, dropped[:, 1:])


# --- collator -----------------------------------------------------------------------------------------


def features(seed: int = 5) -> list[dict[str, list[int]]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = [40, 25, 33, 1]
    return [{"input_ids": torch.randint(2, 200, (n,), generator=generator).tolist()} for n in lengths]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_collator_drops_what_drop_mask_of_causal_targets_drops(strategy: str) -> None:
    pad = 0
    collated = GoldfishCollator(pad, strategy, k=2, h=4, special_token_ids=[7], seed=3)(features())
    input_ids, attention_mask, labels = collated["input_ids"], collated["attention_mask"], collated["labels"]
    assert input_ids.shape == attention_mask.shape == labels.shape == (4, 40)

    targets = causal_targets(input_ids, attention_mask)
    expected_dropped = drop_mask(targets, strategy, 2, 4, special_token_ids=[7], seed=3)
    # Dropped label j+1 <=> target j dropped; padding is -100 and never counted as dropped.
    collator_dropped = torch.zeros_like(expected_dropped)
    collator_dropped[:, :-1] = (labels[:, 1:] == IGNORE_INDEX) & (attention_mask[:, 1:] == 1)
    assert torch.equal(collator_dropped, expected_dropped)
    assert expected_dropped.any()
    assert not collator_dropped[:, :-1][attention_mask[:, 1:] == 0].any()
    # Kept labels are the input ids; padding is padded.
    kept = (attention_mask == 1) & (labels != IGNORE_INDEX)
    assert torch.equal(labels[kept], input_ids[kept])
    assert (input_ids[attention_mask == 0] == pad).all() and (labels[attention_mask == 0] == IGNORE_INDEX).all()
    assert attention_mask.sum(dim=1).tolist() == [40, 25, 33, 1]


def test_collator_without_strategy_and_with_given_labels() -> None:
    plain = GoldfishCollator(pad_token_id=1, strategy=None)(features())
    assert torch.equal(plain["labels"][plain["attention_mask"] == 1], plain["input_ids"][plain["attention_mask"] == 1])
    # User labels (a masked prompt) are kept as given; the mask applies on top of them.
    ids = torch.arange(10, 40)
    labels = ids.clone()
    labels[:12] = IGNORE_INDEX
    collated = GoldfishCollator(0, "hashed", k=2, h=4)([{"input_ids": ids, "labels": labels}])
    assert (collated["labels"][0, :12] == IGNORE_INDEX).all()
    # The hash reads the true prompt tokens: the answer's mask is the whole sequence's, cut to the answer (as
    # goldfish training on conversations draws it), so its first targets can be dropped too.
    whole = drop_mask(causal_targets(ids[None]), "hashed", 2, 4)[0]  # whole[j]: label j + 1 dropped
    expected = torch.where(whole[11:-1], IGNORE_INDEX, ids[12:])
    assert torch.equal(collated["labels"][0, 12:], expected) and whole[11:14].any()
    # TRL's names for the loss region give the same labels
    for key in ("assistant_masks", "completion_mask"):
        region = (torch.arange(30) >= 12).long()
        same = GoldfishCollator(0, "hashed", k=2, h=4)([{"input_ids": ids, key: region}])
        assert torch.equal(same["labels"], collated["labels"])


def test_collator_random_masks_change_between_batches() -> None:
    collator = GoldfishCollator(0, "random", k=2, seed=0)
    first, second = collator(features()), collator(features())
    assert not torch.equal(first["labels"], second["labels"])
    again = GoldfishCollator(0, "random", k=2, seed=0)(features())
    assert torch.equal(first["labels"], again["labels"])


def test_collator_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="unknown goldfish strategy"):
        GoldfishCollator(0, "nope")
    collator = GoldfishCollator(0, "hashed")
    with pytest.raises(ValueError, match="unexpected keys"):
        collator([{"input_ids": [1, 2], "text": "hi"}])
    with pytest.raises(ValueError, match="same length"):
        collator([{"input_ids": [1, 2, 3], "labels": [1, 2]}])
    with pytest.raises(ValueError, match="1-D sequence of integers"):
        collator([{"input_ids": [1.5, 2.0]}])
    with pytest.raises(ValueError, match="empty batch"):
        collator([])


def test_hf_model_loss_with_collator_labels_equals_goldfish_loss() -> None:
    """An HF Llama fed the collator's labels optimises the same loss as goldfish_loss on causal targets."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = LlamaForCausalLM(config).eval()
    collated = GoldfishCollator(0, "hashed", k=3, h=4)(features())
    with torch.no_grad():
        output = model(**collated)
    targets = causal_targets(collated["input_ids"], collated["attention_mask"])
    ours = goldfish_loss(output.logits, targets, drop_mask(targets, "hashed", 3, 4))
    torch.testing.assert_close(output.loss, ours.loss, rtol=1e-5, atol=1e-6)
