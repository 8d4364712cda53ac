"""The outputs of the quick start and the corpus preset keep every field they have today: small runs of both, with
every key path of their summary.json, run records and report.md headings checked against the files kept in
bench/results/ (the published runs) and tests/e2e/baselines/ (run records of the same small runs, kept when the
typed results came in). New fields may appear; none may go."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import pytest
from tiny_runs import tiny_run

from goldfish.app.cli import main

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "results"
BASELINES = Path(__file__).resolve().parent / "baselines"
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()


def _is_data_key(key: str) -> bool:
    """A key that names data rather than a field: a number (seeds, buckets) or a document id ("compound#23")."""
    return "#" in key or re.fullmatch(r"-?\d+(\.\d+)?", key) is not None


def key_paths(value: Any, path: str = "") -> tuple[set[str], set[str]]:
    """(paths, empty): every key path of a JSON value (dicts recursively, every element of a list under "[]", the
    keys of a dict keyed by data under "*"), and the paths of empty or null containers, under which nothing can be
    compared (a small run may, e.g., remove no duplicate)."""
    paths: set[str] = set()
    empty: set[str] = set()
    if isinstance(value, dict):
        if not value:
            empty.add(path)
        for key, item in value.items():
            child = f"{path}/{'*' if _is_data_key(str(key)) else key}"
            paths.add(child)
            sub, sub_empty = key_paths(item, child)
            paths |= sub
            empty |= sub_empty
    elif isinstance(value, list):
        if not value:
            empty.add(path)
        for item in value:
            sub, sub_empty = key_paths(item, f"{path}/[]")
            paths |= sub
            empty |= sub_empty
    elif value is None:
        empty.add(path)
    return paths, empty


def missing_paths(old: Any, new: Any) -> list[str]:
    """The key paths of `old` that `new` lacks, except those under a container that is empty (or null) in `new`."""
    old_paths, _ = key_paths(old)
    new_paths, new_empty = key_paths(new)
    return sorted(p for p in old_paths - new_paths if not any(p.startswith(e + "/") for e in new_empty if e != ""))


def headings(report: Path) -> list[str]:
    return [line for line in report.read_text(encoding="utf-8").splitlines() if line.startswith("#")]


def _json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def test_key_paths_see_a_lost_field_and_forgive_empty_data() -> None:
    old = {"a": {"b": 1, "c": [{"d": 2}]}, "ids": {"x#1": {"n": 1}}, "removed": [{"id": "x"}]}
    assert missing_paths(old, old) == []
    assert missing_paths(old, {"a": {"b": 1, "c": [{"e": 2}]}, "ids": {"y#2": {"n": 3}}, "removed": []}) == [
        "/a/c/[]/d"
    ]
    assert missing_paths(old, {"a": {"c": []}, "ids": {}, "removed": []}) == ["/a/b"]


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`goldfish compare` (the quick start's command) on the smallest documents, two epochs."""
    out = tmp_path_factory.mktemp("quickstart") / "out"
    argv = ["compare", *tiny_run(epochs=2, curve_every=1, bootstrap=50, suffix_len=16), "--out", str(out)]
    assert main(argv) == 0
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`goldfish compare --preset corpus` shrunk (its 32/32 extraction kept): a small background file, 8 targets of
    64 tokens, one seed, 8 steps."""
    folder = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    background = folder / "background.jsonl"
    background.write_text(
        "".join(
            json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(rng.randrange(20, 300)))}) + "\n"
            for _ in range(100)
        )
    )
    out = folder / "out"
    settings = tiny_run(
        n_train=8,
        n_heldout=2,
        seq_len=64,
        batch_size=4,
        vocab_size=400,
        background=background,
        extract_len=64,
        min_doc_tokens=40,
        max_doc_tokens=300,
        max_steps=8,
        eval_every=4,
        val_tokens=512,
        bootstrap=50,
        seeds="0",
        tokenize_workers=1,
    )
    assert main(["compare", "--preset", "corpus", *settings, "--out", str(out)]) == 0
    return out


def test_quickstart_keeps_every_field(quickstart: Path) -> None:
    today = BENCH / "compare_quickstart"
    assert missing_paths(_json(today / "summary.json"), _json(quickstart / "summary.json")) == []
    assert headings(quickstart / "report.md") == headings(today / "report.md")
    for label in ("standard", "goldfish-hashed-k4-h13"):
        record = _json(quickstart / label / "run.json")
        assert missing_paths(_json(BASELINES / "quickstart_run.json"), record) == [], label


def test_corpus_preset_keeps_every_field(corpus: Path) -> None:
    today = BENCH / "compare_corpus"
    # Removed on purpose (issue 42): the pooled binomial interval over target-seed pairs counted every target once
    # per seed as independent; the clustered `cluster_ci` and `exact_bounds` replace it.
    removed = {
        f"/combined/{label}/buckets/[]/exact_match_pooled/ci" for label in _json(today / "summary.json")["combined"]
    }
    assert set(missing_paths(_json(today / "summary.json"), _json(corpus / "summary.json"))) <= removed
    assert headings(corpus / "report.md") == headings(today / "report.md")
    seed = corpus / "seed-0"
    # bucket_tests' one-line "test" became "what" (a meaning per key: the paired tests beside Fisher's), issue 42
    assert missing_paths(_json(today / "seed-0" / "summary.json"), _json(seed / "summary.json")) in (
        [],
        ["/bucket_tests/test"],
    )
    assert headings(seed / "report.md") == headings(today / "seed-0" / "report.md")
    for label in ("standard", "goldfish-hashed-k4-h13", "goldfish-random-k4"):
        record = _json(seed / label / "run.json")
        assert missing_paths(_json(BASELINES / "corpus_run.json"), record) == [], label
