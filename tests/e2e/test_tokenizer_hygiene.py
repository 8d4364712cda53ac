"""What a run keeps apart from its held-out text (issue 42): the tiny models' BPE is trained without any held-out
target (nor a background copy of one), validation rows have no copy in the training stream, and a vocabulary smaller
than --vocab-size asked is said (issue 45)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from tiny_runs import tiny_run

import data
import data.tokenizer
from data.background import build_background
from data.corpus import text_key, tokenize_corpus
from data.dedup import CONTAINMENT_THRESHOLD, sample_containment
from data.selection import shuffled_order
from engine.training import train as engine_train
from goldfish.app.cli import main
from goldfish.app.config import DataSpec, MaskSpec
from goldfish.app.data_settings import background_spec, row_mask

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


@pytest.fixture
def trainer_texts(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Every list of texts a BPE trainer is given during the test: the real data.encoding.training_pieces, which
    feeds the trainer inside data.train_bpe_tokenizer, recording its input."""
    calls: list[list[str]] = []
    real = data.tokenizer.training_pieces

    def recording(texts, *args, **kwargs):
        texts = list(texts)
        calls.append(texts)
        return real(texts, *args, **kwargs)

    monkeypatch.setattr(data.tokenizer, "training_pieces", recording)
    return calls


def _own_word(doc: str) -> str:
    """The word only document `doc` ("d3") holds, in letters (the BPE's pre-tokenizer splits digits off)."""
    return "own" + chr(ord("a") + int(doc[1:])) * 3 + "word"


def _targets(folder: Path, n: int = 14) -> dict[str, str]:
    """A --data file of n documents, each with a word of its own repeated (a BPE trained on it merges the word); the
    first two of the order --data-seed 0 draws are too short for any run here."""
    rng = random.Random(3)
    short = set(shuffled_order(n, 0)[:2])
    texts = {
        f"d{i}": " ".join(
            _own_word(f"d{i}") if j % 3 == 0 else rng.choice(WORDS) for j in range(6 if i in short else 90)
        )
        for i in range(n)
    }
    (folder / "targets.jsonl").write_text("".join(json.dumps({"id": k, "text": v}) + "\n" for k, v in texts.items()))
    return texts


def _check_no_heldout_text(calls: list[list[str]], summary: dict, texts: dict[str, str]) -> None:
    assert calls, "no tokenizer was trained"
    given = [t for call in calls for t in call]
    heldout = [d["id"] for d in summary["documents"]["heldout"]]
    train = [d["id"] for d in summary["documents"]["train"]]
    assert heldout and train
    for doc in heldout:  # neither the document nor any copy of it, whole or inside a longer text
        assert not any(texts[doc] in t for t in given), doc
        assert not any(_own_word(doc) in t for t in given), doc
    assert all(any(texts[doc] == t for t in given) for doc in train)  # the text the model trains on is there
    fit = summary["documents"]["tokenizer_fit"]
    assert fit["documents"] >= len(train) and fit["vocab_size"] > 0


def test_compare_tokenizer_never_sees_a_heldout_document(tmp_path: Path, trainer_texts, capsys) -> None:
    texts = _targets(tmp_path)
    out = tmp_path / "cmp"
    data_options = ["--data", str(tmp_path / "targets.jsonl"), "--id-field", "id"]
    settings = tiny_run(n_train=4, n_heldout=4, seq_len=48, vocab_size=600, epochs=1, suffix_len=16, bootstrap=0)
    assert main(["compare", "--out", str(out), *data_options, *settings, "--masks", "hashed:4:13"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    _check_no_heldout_text(trainer_texts, summary, texts)
    # the first 4 of the order held 2 short documents: the BPE learnt the first 8, two of them long enough but past
    # the 4 training places, which held-out places never take
    assert summary["documents"]["tokenizer_fit"]["documents"] == summary["documents"]["train_within"] == 8
    # the saved tokenizer agrees: no held-out document's own word is one token, every training document's is
    checkpoint = out / "standard" / "checkpoint"
    vocabulary = set(data.load_tokenizer(checkpoint).get_vocab())
    for doc in summary["documents"]["heldout"]:
        assert "Ġ" + _own_word(doc["id"]) not in vocabulary
    assert all("Ġ" + _own_word(doc["id"]) in vocabulary for doc in summary["documents"]["train"])
    # evaluating the checkpoint selects the run's documents again, by its recorded bound (eval refuses others)
    assert main(["eval", "--model", str(checkpoint), "--out", str(tmp_path / "eval"), "--suffix-len", "16"]) == 0
    again = tmp_path / "again"
    assert (
        main(["compare", "--checkpoints", f"standard={checkpoint}", "--out", str(again), *data_options, *settings]) == 0
    )
    selected = json.loads((again / "summary.json").read_text())["documents"]
    assert [(d["id"], d["sha256"]) for d in selected["heldout"]] == [
        (d["id"], d["sha256"]) for d in summary["documents"]["heldout"]
    ]


@pytest.mark.slow  # a background study, about 15 s; tests/unit/test_tokenizer_fit.py checks the rule itself
def test_compare_with_background_tokenizer_never_sees_a_heldout_target_or_its_copy(
    tmp_path: Path, trainer_texts, capsys
) -> None:
    texts = _targets(tmp_path)
    rng = random.Random(1)
    background = [_text(rng, rng.randrange(20, 200)) for _ in range(150)]
    # a copy of every target in the background, as it is and inside a longer page: left out of the tokenizer's text
    for i, text in enumerate(texts.values()):
        background[2 * i] = text.upper()
        background[2 * i + 1] = _text(rng, 40) + " " + text + " " + _text(rng, 40)
    source = tmp_path / "background.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in background))
    out = tmp_path / "cmp"
    argv = ["compare", "--out", str(out), "--data", str(tmp_path / "targets.jsonl"), "--id-field", "id"]
    argv += tiny_run(
        n_train=4,
        n_heldout=4,
        seq_len=64,
        batch_size=4,
        vocab_size=400,
        background=source,
        repeats="0,1,3",
        min_doc_tokens=40,
        max_doc_tokens=1000,
        max_steps=4,
        val_tokens=512,
        masks="hashed:4:13",
        bootstrap=0,
    )
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    _check_no_heldout_text([[t.lower() for t in call] for call in trainer_texts], summary, texts)
    fit = summary["documents"]["tokenizer_fit"]
    # every copy of a long-enough target is found (a 6-word one's shingle sample may be empty: only its exact copy)
    assert 2 * (len(texts) - 2) <= fit["background_copies_left_out"] <= 2 * len(texts)
    assert fit["background_documents"] == 150 - fit["background_copies_left_out"]
    # the report states the targets' share and the validation candidates left out, next to the validation table
    report = (out / "report.md").read_text()
    section = report[report.index("## Validation (held-out background)") :]
    share = summary["corpus"]["target_share"]
    assert f"Target copies are {100 * share:.1f}% of the" in section.split("|")[0]
    assert "were left out of validation and of the stream" in section.split("|")[0]


@pytest.fixture(scope="module")
def twins(tmp_path_factory: pytest.TempPathFactory):
    """A background of 240 documents in which 60 have a twin: 30 exact (upper-cased, re-spaced), 30 near (the
    document inside a longer one)."""
    rng = random.Random(5)
    folder = tmp_path_factory.mktemp("twins")
    texts = [_text(rng, rng.randrange(30, 80)) for _ in range(180)]
    texts += ["  " + t.upper().replace(" ", "  ") for t in texts[:30]]
    texts += [_text(rng, 10) + " " + t + " " + _text(rng, 10) for t in texts[30:60]]
    order = list(range(len(texts)))
    rng.shuffle(order)
    texts = [texts[i] for i in order]
    (folder / "bg.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    targets = [data.Document(id=f"t{i}", text=f"target {i}: " + _text(rng, 60), source="t") for i in range(4)]
    tokenizer = data.train_bpe_tokenizer([d.text for d in targets[:3]] + texts, vocab_size=400)
    split = data.select_documents(targets, tokenizer, n_train=3, n_heldout=1, seq_len=20, whole_documents=64)
    corpus = tokenize_corpus(str(folder / "bg.jsonl"), tokenizer, cache_dir=folder / "cache", progress=False)
    return folder, tokenizer, split, corpus, texts


def test_validation_leaves_out_documents_with_a_twin_in_the_background(twins) -> None:
    folder, tokenizer, split, corpus, texts = twins
    spec = DataSpec(source="x", background=str(folder / "bg.jsonl"), seq_len=32, repeats=(1, 4), val_tokens=3000)
    train = engine_train.TrainConfig(epochs=1, batch_size=4, shuffle=False, progress=False)
    background = build_background(
        background_spec(spec),
        corpus,
        split.train,
        split.heldout,
        tokenizer,
        row_mask(MaskSpec("hashed", 4, 13), sorted(set(tokenizer.all_special_ids))),
        train,
        tokenizer.pad_token_id,
    )
    validation = background.record["validation"]
    removed = validation["removed_copies"]
    assert removed["exact_text"] > 0 and removed["near"] > 0  # the planted twins reach the validation candidates
    left_out = {r["document"] for r in removed["documents"]}
    assert len(left_out) == removed["exact_text"] + removed["near"] == len(removed["documents"])
    val_docs = set(background.validation_documents.tolist())
    stream = set(background.pieces.document.tolist())
    assert len(val_docs) == validation["n_documents"] and not (val_docs | stream) & left_out and not val_docs & stream
    assert sum(int(corpus.lengths[d]) + 1 for d in val_docs) >= spec.val_tokens  # still the tokens asked for
    # no validation document has a copy in the stream: not the same normalized text, not half of it in one document
    stream_keys = {text_key(texts[d]) for d in stream}
    assert not any(text_key(texts[d]) in stream_keys for d in val_docs)
    ordered = sorted(stream)
    held = sample_containment(corpus.samples(ordered), corpus.samples(sorted(val_docs)), CONTAINMENT_THRESHOLD)
    assert held == []
    # and without the rule some would have: a left-out document's twin is in the stream
    assert any(r["twin"] in stream for r in removed["documents"])
    for r in removed["documents"]:
        if r["kind"] == "exact-text":
            assert text_key(texts[r["document"]]) == text_key(texts[r["twin"]])
        else:
            assert r["containment"] >= CONTAINMENT_THRESHOLD


def test_a_vocabulary_smaller_than_asked_is_said(tmp_path: Path, capsys) -> None:
    rng = random.Random(2)
    records = [{"text": _text(rng, 60)} for _ in range(8)]  # 19 words: far fewer pairs than 2048 tokens need
    (tmp_path / "small.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "run"
    argv = ["train", "--out", str(out), "--data", str(tmp_path / "small.jsonl")]
    assert main(argv + tiny_run(vocab_size=2048, epochs=1)) == 0
    err = capsys.readouterr().err
    fit = json.loads((out / "run.json").read_text())["documents"]["tokenizer_fit"]
    assert fit["vocab_size"] < 2048 and fit["vocab_size_asked"] == 2048
    assert fit["warning"].startswith(f"the trained BPE tokenizer has {fit['vocab_size']} tokens, fewer than the 2048")
    assert [line for line in err.splitlines() if "fewer than the 2048" in line] == [f"warning: {fit['warning']}"]
