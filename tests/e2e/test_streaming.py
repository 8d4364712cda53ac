"""--background-streaming: a corpus read as a stream, only as far as the run needs, equal to the non-streamed one."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from tiny_runs import tiny_run

import data
from data.corpus import stream_corpus, tokenize_corpus
from goldfish.app.cli import main

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = random.Random(0)
    path = tmp_path_factory.mktemp("stream") / "background.jsonl"
    with path.open("w") as handle:
        for _ in range(2000):  # about 110k words: far more than the budgets below
            handle.write(
                json.dumps({"body": " ".join(rng.choice(WORDS) for _ in range(rng.randrange(10, 100)))}) + "\n"
            )
    return path


@pytest.fixture(scope="module")
def tokenizer():
    return data.train_bpe_tokenizer([" ".join(WORDS)] * 20, vocab_size=300)


def test_stream_reads_the_first_documents_up_to_the_budget(corpus_file: Path, tokenizer, tmp_path: Path) -> None:
    streamed = stream_corpus(
        str(corpus_file), tokenizer, 5000, text_field="body", cache_dir=tmp_path / "cache", progress=False
    )
    whole = tokenize_corpus(
        str(corpus_file), tokenizer, text_field="body", cache_dir=tmp_path / "cache", progress=False
    )
    assert len(whole) == 2000 and 20 < len(streamed) < 200  # stopped at the budget, not at the file's end
    assert all(streamed.ids(i) == whole.ids(i) for i in range(len(streamed)))  # the same first documents, in order
    assert (streamed.keys() == whole.keys()[: len(streamed)]).all()
    # the last document read is the one that reaches the budget: none is tokenized beyond it
    assert int(whole.lengths[: len(streamed) - 1].sum()) < 5000 <= streamed.n_tokens == int(streamed.lengths.sum())
    assert streamed.budget == 5000
    again = stream_corpus(
        str(corpus_file), tokenizer, 5000, text_field="body", cache_dir=tmp_path / "cache", progress=False
    )
    assert again.dataset.cache_files == streamed.dataset.cache_files  # read from the cache, not streamed again


def test_a_stream_shorter_than_the_budget_gives_what_it_holds(corpus_file: Path, tokenizer, tmp_path: Path) -> None:
    whole = tokenize_corpus(str(corpus_file), tokenizer, text_field="body", cache_dir=tmp_path, progress=False)
    streamed = stream_corpus(str(corpus_file), tokenizer, 10**9, text_field="body", cache_dir=tmp_path, progress=False)
    assert len(streamed) == 2000 and streamed.n_tokens == whole.n_tokens


def test_stream_errors_name_the_problem(corpus_file: Path, tokenizer, tmp_path: Path) -> None:
    with pytest.raises(data.DataError, match="has no field 'text'.*--background-text-field"):
        stream_corpus(str(corpus_file), tokenizer, 100, cache_dir=tmp_path, progress=False)
    with pytest.raises(data.DataError, match="no such file or folder"):
        stream_corpus(str(tmp_path / "missing.jsonl"), tokenizer, 100, cache_dir=tmp_path, progress=False)


def test_train_with_a_streamed_background(corpus_file: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    argv = [
        "train",
        "--out",
        str(out),
        *tiny_run(
            seq_len=64,
            batch_size=4,
            vocab_size=400,
            threads=None,
            background=corpus_file,
            background_text_field="body",
            background_streaming=True,
            repeats="1,3",
            min_doc_tokens=40,
            max_doc_tokens=1000,
            max_steps=3,
            val_tokens=256,
        ),
    ]
    assert main(argv) == 0
    assert "tokens streamed from" in capsys.readouterr().out
    corpus = json.loads((out / "run.json").read_text())["corpus"]
    # 3 steps x 4 rows x 64 tokens + 256 validation tokens, 10% margin: far less than the file's ~150k tokens
    assert corpus["streaming"] is True and corpus["stream_token_budget"] == int(1.1 * (3 * 4 * 64 + 256)) + 1
    assert corpus["n_tokens"] < 2 * corpus["stream_token_budget"]
    assert len([json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]) == 3


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--background-streaming", "--max-steps", "3"], "--background-streaming streams the background corpus"),
        (["--background", "x.jsonl", "--background-streaming"], "an endless stream has no epoch"),
    ],
)
def test_streaming_settings_errors_are_one_line_exit_2(extra: list[str], message: str, tmp_path: Path, capsys) -> None:
    for command in ("train", "compare"):
        assert main([command, "--out", str(tmp_path / command), *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1
