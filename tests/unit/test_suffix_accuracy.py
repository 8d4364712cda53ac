"""The suffix's teacher-forced top-1 accuracy (eval.metrics.suffix_tf_accuracy): its formula on a hand-computed
case, and in extraction's rows and summary on a real (tiny) model."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from eval.decoding import greedy_decode
from eval.extraction import ExtractionConfig, extract
from eval.metrics import HEADLINE_METRICS, METRICS, suffix_tf_accuracy


@dataclass
class Doc:
    id: str
    token_ids: list[int]


def test_hand_computed_case() -> None:
    # document 10 11 12 13 14, prefix 10 11, suffix 12 13 14; entry j of the predictions guesses token j + 1:
    # 12 is guessed by entry 1 (12: right), 13 by entry 2 (0: wrong), 14 by entry 3 (14: right) -> 2 of 3
    predicted = [11, 12, 0, 14, 99]
    assert suffix_tf_accuracy(predicted, [12, 13, 14], prefix_len=2) == pytest.approx(2 / 3)
    assert suffix_tf_accuracy(torch.tensor(predicted), [12, 13, 14], prefix_len=2) == pytest.approx(2 / 3)
    # entry 0 (11) guesses token 1 only: with a one-token prefix the suffix 11 12 13 is scored by entries 0..2
    assert suffix_tf_accuracy(predicted, [11, 12, 13], prefix_len=1) == pytest.approx(2 / 3)
    assert suffix_tf_accuracy(predicted, [11, 12, 0], prefix_len=1) == 1.0


def test_bad_arguments_name_the_problem() -> None:
    with pytest.raises(ValueError, match="prefix of at least 1 token"):
        suffix_tf_accuracy([1, 2, 3], [2, 3], prefix_len=0)
    with pytest.raises(ValueError, match="needs predictions up to position"):
        suffix_tf_accuracy([1, 2], [2, 3, 4], prefix_len=1)


def test_it_is_a_headline_metric_with_a_column() -> None:
    assert "suffix_tf_accuracy" in HEADLINE_METRICS and METRICS["suffix_tf_accuracy"].header


def _tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        initializer_range=0.2,  # peaked logits: greedy output does not collapse into one repeated token
    )
    return LlamaForCausalLM(config).eval()


def test_extraction_rows_carry_it_from_the_teacher_forced_pass(one_thread: None) -> None:
    model = _tiny_llama()
    generator = torch.Generator().manual_seed(1)
    prefix = torch.randint(3, 256, (12,), generator=generator).tolist()
    own = Doc("own", prefix + greedy_decode(model, [prefix], 8, pad_token_id=0)[0])  # the model's own continuation
    other = Doc("other", torch.randint(3, 256, (20,), generator=generator).tolist())
    rows, summary = extract(
        model, [own, other], ExtractionConfig(suffix_len=8), decode=str, pad_token_id=0, progress=False
    )
    # the greedy continuation is, token by token, what the model ranks first: all of it
    assert rows[0]["suffix_tf_accuracy"] == 1.0
    # the other document: recomputed from the model's argmax predictions over the whole document
    with torch.no_grad():
        predicted = model(torch.tensor([other.token_ids])).logits[0].argmax(-1)
    expected = suffix_tf_accuracy(predicted, other.token_ids[12:], prefix_len=12)
    assert rows[1]["suffix_tf_accuracy"] == pytest.approx(expected)
    assert summary["suffix_tf_accuracy"] == pytest.approx((1.0 + expected) / 2)
