"""Long and many texts are tokenized in bounded pieces (data.encoding) to exactly the ids of one call on each whole
text; the tiny models' BPE trained on pieces equals the one trained on whole texts; the exact-text dedup key is
computed in pieces to the digest of the whole normalized text."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, decoders, models, trainers
from transformers import PreTrainedTokenizerFast

from data.dedup import _digest, normalized_digest, normalized_text
from data.encoding import clean_cuts, encode_bounded, space_cuts, training_pieces
from data.tokenizer import train_bpe_tokenizer

WORDS = ["river", "stone", "Light", "paper,", "quiet.", "north", "  table", "green\n", "ΟΔΟΣ", "ﬁne", "x" * 40]


def _text(n_words: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) + str(rng.randint(0, 9)) for _ in range(n_words))


def _whole(tokenizer, text: str) -> list[int]:
    return tokenizer([text], add_special_tokens=False)["input_ids"][0]


@pytest.fixture(scope="module")
def byte_level():
    return train_bpe_tokenizer([_text(400, seed) for seed in range(5)], vocab_size=400)


def test_space_cuts_fall_before_a_space_between_two_non_spaces():
    text = "ab  cd ef\tgh ij"
    cuts = space_cuts(text, 2)
    assert cuts == [6, 12]
    assert all(text[c] == " " and not text[c - 1].isspace() and not text[c + 1].isspace() for c in cuts)
    assert space_cuts("x" * 50, 4) == []  # no space: one piece


@pytest.mark.parametrize("keep", [None, 7, 10_000])
def test_bounded_encoding_equals_one_call_per_whole_text(byte_level, keep):
    texts = [_text(n, seed) for seed, n in enumerate([3, 900, 0, 50, 2000, 1])]
    got = list(encode_bounded(byte_level, texts, keep=keep, batch_chars=500, piece_chars=300))
    for text, encoded in zip(texts, got, strict=True):
        whole = _whole(byte_level, text)
        assert encoded.n_ids == len(whole)
        assert encoded.ids == (whole if keep is None else whole[:keep])
    assert clean_cuts(byte_level, texts[4], 300), "the byte-level tokenizer should be cut, not encoded whole"


def test_a_tokenizer_whose_tokens_cross_spaces_is_encoded_whole():
    """No pre-tokenizer: BPE merges across spaces, a cut changes the ids, and the text falls back to one call."""
    backend = Tokenizer(models.BPE())
    backend.decoder = decoders.ByteLevel()
    text = "ab ab ab ba ab ab " * 200
    backend.train_from_iterator([text], trainer=trainers.BpeTrainer(vocab_size=40, show_progress=False))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend)
    assert clean_cuts(tokenizer, text, 100) is None
    (encoded,) = encode_bounded(tokenizer, [text], piece_chars=100)
    assert encoded.ids == _whole(tokenizer, text)


def test_the_tiny_bpe_trained_on_pieces_is_the_one_trained_on_whole_texts():
    texts = [_text(3000, 1), _text(20, 2)]
    from tokenizers import pre_tokenizers

    def trained(pieces):
        backend = Tokenizer(models.BPE())
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = trainers.BpeTrainer(
            vocab_size=500, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
        )
        backend.train_from_iterator(pieces, trainer=trainer)
        return backend.to_str()

    assert len(list(training_pieces(texts, piece_chars=500))) > 10
    assert trained(training_pieces(texts, piece_chars=500)) == trained(texts)


@pytest.mark.parametrize("seed", range(4))
def test_the_exact_text_key_in_pieces_is_the_whole_texts_digest(seed):
    rng = random.Random(seed)
    pieces = ["Hello,", "WORLD", "ΟΔΟΣ", "ΟΔΟΣ.", "a\u0301", "\u00a0", "ﬁ", "  ", "\n", "...", "e\u0301x", "«q»"]
    text = "".join(rng.choice(pieces) + rng.choice([" ", "", "\t", "\n"]) for _ in range(400))
    assert normalized_digest(text, chunk_chars=7) == _digest(normalized_text(text))
    assert normalized_digest(text) == _digest(normalized_text(text))
    assert normalized_digest("  ...  ") == _digest(normalized_text("  ...  ")) == _digest("")
