"""data.select_fitting_tokenizer: a run's own tokenizer is trained on the part of the seeded order its training
documents come from, and the held-out documents come after it, so none is ever in the tokenizer's text."""

from __future__ import annotations

import random

import pytest

import data
from data.selection import shuffled_order

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()


def _pool(n: int = 40, short_every: int = 3) -> list[data.Document]:
    """n documents, every `short_every`-th too short for a 40-token window."""
    rng = random.Random(7)
    return [
        data.Document(
            id=f"d{i}", text=" ".join(rng.choice(WORDS) for _ in range(6 if i % short_every == 0 else 80)), source="t"
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("dedup", ["off", "near"])
def test_the_tokenizer_never_trains_on_a_heldout_document(dedup: str) -> None:
    documents = _pool()
    calls: list[list[str]] = []

    def fit(texts: list[str]):
        calls.append(list(texts))
        return data.train_bpe_tokenizer(texts, vocab_size=400)

    settings = dict(n_train=10, n_heldout=8, seq_len=40, seed=3, dedup=data.DedupConfig(mode=dedup))
    tokenizer, split = data.select_fitting_tokenizer(documents, fit, **settings)
    within = split.tokenizer_fit["documents"]
    assert split.tokenizer_fit["rounds"] == len(calls) >= 2  # the first 10 of the order held short ones: it grew
    order = shuffled_order(len(documents), 3)
    assert calls[-1] == [documents[i].text for i in order[:within]]
    place = {documents[i].id: p for p, i in enumerate(order)}
    assert len(split.train) == 10 and len(split.heldout) == 8
    assert all(place[d.id] < within for d in split.train) and all(place[d.id] >= within for d in split.heldout)
    for call in calls:  # no round ever gave the trainer a held-out text
        assert not {d.text for d in split.heldout} & set(call)
    # the tokenizer and the bound select the same split again (what goldfish eval does from the run record)
    again = data.select_documents(documents, tokenizer, **settings, train_within=within)
    assert [(d.id, d.token_ids) for d in again.train + again.heldout] == [
        (d.id, d.token_ids) for d in split.train + split.heldout
    ]
    assert again.manifest()["train_within"] == split.manifest()["train_within"] == within


def test_a_pool_too_small_once_the_tokenizer_has_its_part_is_refused_in_one_line() -> None:
    documents = _pool(n=20, short_every=2)  # 10 long enough: 8 train and 4 held-out cannot both be found

    def fit(texts: list[str]):
        return data.train_bpe_tokenizer(texts, vocab_size=300)

    with pytest.raises(data.DataError, match="not enough documents of at least 40 tokens") as error:
        data.select_fitting_tokenizer(documents, fit, n_train=8, n_heldout=4, seq_len=40)
    assert "\n" not in str(error.value)
