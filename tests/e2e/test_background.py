"""Targets at controlled repetitions inside a background corpus: the stream, exposures, validation, exact resume."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from tiny_runs import tiny_run

import data
from conventions import IGNORE_INDEX
from data.background import build_background
from data.corpus import tokenize_corpus
from engine.training import train as engine_train
from goldfish.app.config import DataSpec, MaskSpec
from goldfish.app.data_settings import background_spec, row_mask
from goldfish.app.models import build_tiny_model
from goldfish.app.prepare import Prepared
from goldfish.app.training_rows import make_step_loss, validation_loss_fn

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory):
    rng = random.Random(0)
    folder = tmp_path_factory.mktemp("bg")
    targets = [data.Document(id=f"t{i}", text=f"target {i}: " + _text(rng, 60), source="t") for i in range(8)]
    background = [_text(rng, rng.randrange(5, 200)) for _ in range(300)]
    background[17] = targets[2].text  # a copy of a training target and one of a held-out target: removed
    background[40] = "  " + targets[7].text.replace(" ", "  ")
    edited = targets[3].text.upper().split()  # near copies: an upper-cased copy with 2 of its 62 words edited ...
    edited[10], edited[40] = "EDITED", "WORDS"
    background[60] = " ".join(edited)
    background[80] = _text(rng, 150) + " " + targets[5].text + " " + _text(rng, 150)  # ... and one inside a page
    background[90] = " ".join(targets[4].text.split()[:18]) + " " + _text(rng, 40)  # 14 of 58 shingles: kept
    with (folder / "bg.jsonl").open("w") as handle:
        handle.writelines(json.dumps({"text": t}) + "\n" for t in background)
    tokenizer = data.train_bpe_tokenizer([d.text for d in targets] + background, vocab_size=400)
    split = data.select_documents(
        targets, tokenizer, n_train=6, n_heldout=2, seq_len=20, dedup=None, whole_documents=64
    )
    corpus = tokenize_corpus(str(folder / "bg.jsonl"), tokenizer, cache_dir=folder / "cache", progress=False)
    return folder, tokenizer, split, corpus


def _background(setup, *, max_steps: int = 0, repeats=(1, 4, 16), mask=MaskSpec("hashed", 4, 13), epochs: int = 1):
    folder, tokenizer, split, corpus = setup
    spec = DataSpec(source="x", background=str(folder / "bg.jsonl"), seq_len=32, repeats=repeats, val_tokens=256)
    train = engine_train.TrainConfig(epochs=epochs, batch_size=4, max_steps=max_steps, shuffle=False, progress=False)
    special = sorted(set(tokenizer.all_special_ids))
    settings, rows_mask = background_spec(spec), row_mask(mask, special)
    return build_background(
        settings, corpus, split.train, split.heldout, tokenizer, rows_mask, train, tokenizer.pad_token_id
    ), train


def test_corpus_is_tokenized_once_and_read_lazily(setup) -> None:
    folder, tokenizer, _, corpus = setup
    assert len(corpus) == 300
    ids = tokenizer(json.loads((folder / "bg.jsonl").read_text().splitlines()[5])["text"], add_special_tokens=False)[
        "input_ids"
    ]
    assert corpus.ids(5) == [tokenizer.bos_token_id] + ids
    again = tokenize_corpus(str(folder / "bg.jsonl"), tokenizer, cache_dir=folder / "cache", progress=False)
    assert again.fingerprint() == corpus.fingerprint()  # the cached map, not a second tokenization


def test_targets_inserted_as_scheduled_and_heldout_never(setup) -> None:
    background, train = _background(setup)
    _, tokenizer, split, _ = setup
    record = background.record
    assert record["n_removed_as_target_copies"] == 4  # the target copies in the background
    removed = record["removed_copies"]
    assert removed["exact_text"] == 2 and removed["near"] == 2  # whitespace aside; edited and inside a page
    assert {(d["document"], d["target"]) for d in removed["near_documents"]} == {(60, "t3"), (80, "t5")}
    assert all(0.5 <= d["containment"] <= 1.0 for d in removed["near_documents"])
    assert 90 not in {d["document"] for d in removed["near_documents"]}  # a quarter of a target's text stays
    assert not {17, 40, 60, 80} & set(background.pieces.document.tolist())
    inserted = [t["inserted"] for t in record["targets"]]
    assert sorted(inserted) == [1, 1, 4, 4, 16, 16]  # two targets per bucket, assigned at random
    assert record["most_copies_in_a_row"] == 1  # 42 copies spread over about a thousand gaps
    # every copy of every target lies in the stream where the record says, and nothing of a held-out target does
    pieces = {str(d.id): d.full_ids + [tokenizer.eos_token_id] for d in split.train}
    stream = [int(t) for r in background.rows for t, p in zip(r.input_ids, r.position_ids)]
    stream = stream[: background.rows.layout.n_tokens]
    for target in record["targets"]:
        piece = pieces[target["id"]]
        assert len(target["stream_offsets"]) == target["inserted"]
        for offset in target["stream_offsets"]:
            assert stream[offset : offset + len(piece)] == piece
    text = tokenizer.decode(stream)
    for doc in split.heldout:
        assert doc.text not in text
    # an uninterrupted run of every row trains every copy: exposures equal insertions, held-out 0
    assert [background.exposures[str(d.id)] for d in split.train] == inserted
    assert all(background.exposures[str(d.id)] == 0 for d in split.heldout)


def test_exposures_count_the_copies_max_steps_trains(setup) -> None:
    background, train = _background(setup, max_steps=30)
    rows_trained = 30 * train.batch_size
    assert background.record["rows_trained"] == rows_trained
    ends = {}
    for row in range(rows_trained):  # count, from the rows themselves, the copies whose last token is trained
        for segment in background.rows.layout.segments(row):
            code = int(background.rows.codes[segment.piece])
            if code < 0 and segment.end == len(background.rows.piece(segment.piece)):
                ends[-code - 1] = ends.get(-code - 1, 0) + 1
    counted = [t["trained"] for t in background.record["targets"]]
    assert counted == [ends.get(t, 0) for t in range(len(counted))]
    assert sum(counted) > 0  # insertions are drawn within the part of the stream the run trains


def test_validation_rows_are_held_out_background(setup) -> None:
    background, train = _background(setup)
    assert len(background.validation) % train.batch_size == 0 and len(background.validation) >= train.batch_size
    row = background.validation[0]
    assert not row.dropped.any()  # validation is the standard loss over every target
    assert (row.targets != IGNORE_INDEX).any()


def test_resume_mid_epoch_equals_uninterrupted_run(setup, tmp_path: Path) -> None:
    """Kill after step 5 (checkpoint at step 4), resume: same rows in the same order, same weights and losses."""
    _, tokenizer, split, _ = setup
    background, train = _background(setup, max_steps=8)
    train = replace(train, save_every=4, lr=3e-3)
    special = sorted(set(tokenizer.all_special_ids))
    loss = make_step_loss(MaskSpec("hashed", 4, 13), special)
    prepared = Prepared(tokenizer=tokenizer, split=split, n_loaded=0, context=32)

    def model():
        return build_tiny_model(
            "micro-llama",
            vocab_size=len(tokenizer),
            max_positions=64,
            seed=0,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )

    def save(m, d, step):
        d.mkdir(parents=True, exist_ok=True)
        torch.save(m.state_dict(), d / "weights.pt")

    whole = model()
    full = engine_train.train(
        whole,
        background.rows,
        loss,
        train,
        out_dir=tmp_path / "a",
        save_model=save,
        validation=background.validation,
        validation_loss_fn=validation_loss_fn(prepared),
    )

    class Killed(Exception):
        pass

    def kill(record):
        if record["step"] == 5:
            raise Killed

    interrupted = model()
    with pytest.raises(Killed):
        engine_train.train(
            interrupted, background.rows, loss, train, out_dir=tmp_path / "b", save_model=save, on_log=kill
        )
    resumed = model()
    resumed.load_state_dict(torch.load(tmp_path / "b" / "checkpoint" / "weights.pt", weights_only=True))
    rest = engine_train.train(
        resumed,
        background.rows,
        loss,
        train,
        out_dir=tmp_path / "b",
        save_model=save,
        resume_from=tmp_path / "b" / "checkpoint",
        validation=background.validation,
        validation_loss_fn=validation_loss_fn(prepared),
    )
    assert [r["loss"] for r in rest.history] == [r["loss"] for r in full.history[4:]]
    assert rest.history[-1]["val_loss"] == full.history[-1]["val_loss"]
    for a, b in zip(whole.state_dict().values(), resumed.state_dict().values()):
        assert torch.equal(a, b)
    # the same stream again (same exposures); a different schedule is refused
    again, _ = _background(setup, max_steps=8)
    assert again.exposures == background.exposures
    other, _ = _background(setup, max_steps=8, repeats=(1, 2))
    with pytest.raises(ValueError, match="training stream differs"):
        other.rows.load_state_dict(background.rows.state_dict())


def test_corpus_preset_resolves_to_a_background_run() -> None:
    from goldfish.app.cli import parse_command_line
    from goldfish.app.commands.compare import compare_spec

    compare = compare_spec(parse_command_line(["compare", "--preset", "corpus", "--max-steps", "50"]), None)
    spec = compare.data
    assert spec.background == "python-docstrings" and spec.pack and spec.insert_window
    assert spec.source == "default-paragraphs" and spec.repeats == (0, 1, 4, 16, 64)
    assert spec.extraction_window == 64 and (compare.extraction.prefix_len, compare.extraction.suffix_len) == (32, 32)
    assert compare.seeds == (0, 1)
    train = compare.train
    assert train.max_steps == 50 and train.epochs == 1  # an explicit option beats the preset


def test_stdlib_background_leaves_out_the_default_corpus_text() -> None:
    from data.corpus import stdlib_files

    files = stdlib_files()
    assert len(files) > 100
    assert not any("pydoc_data" in f.parts or "test" in f.parts for f in files)


def test_compare_with_background_reports_validation_and_repetitions(tmp_path: Path, capsys) -> None:
    from goldfish.app.cli import main

    rng = random.Random(1)
    source = tmp_path / "background.jsonl"
    with source.open("w") as handle:
        handle.writelines(json.dumps({"text": _text(rng, rng.randrange(20, 200))}) + "\n" for _ in range(120))
    out = tmp_path / "cmp"
    argv = [
        "compare",
        "--out",
        str(out),
        *tiny_run(
            seq_len=64,
            batch_size=4,
            vocab_size=400,
            threads=None,
            background=source,
            repeats="1,3",
            min_doc_tokens=40,
            max_doc_tokens=1000,
            max_steps=4,
            eval_every=2,
            val_tokens=512,
            masks="hashed:4:13",
            bootstrap=0,
        ),
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert printed.count("background: 120 documents") == 1  # loaded once, reused by every model
    summary = json.loads((out / "summary.json").read_text())
    for model in ("control", "standard", "goldfish-hashed-k4-h13"):
        assert summary["models"][model]["validation"]["loss"] > 0
        repetitions = [row["repeats"] for row in summary["breakdowns"]["repeats"][model]]
        assert repetitions[0] == 0 and len(repetitions) >= 2  # held-out targets first: repetition 0
    assert summary["corpus"]["heldout_inserted"] == 0
    assert {"val_loss.png", "breakdown_repeats.png"} <= {p.name for p in out.iterdir()}


def test_python_docstrings_background_is_the_stdlib_docstrings(tmp_path: Path) -> None:
    """The "python-docstrings" background: the standard library's docstrings (parsed, never imported), one
    document each, none from pydoc_data (the default corpus' text: the embedded study's targets)."""
    import ast

    from data.corpus import DOCSTRING_MIN_CHARS, PYTHON_DOCSTRINGS, load_raw_corpus, stdlib_docstrings, stdlib_files

    files = stdlib_files()
    assert not any("pydoc_data" in path.parts for path in files)
    sample = files[:20]
    expected = [
        text
        for path in sample
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and (text := ast.get_docstring(node)) is not None
        and len(text) >= DOCSTRING_MIN_CHARS
    ]
    assert stdlib_docstrings(sample) == expected and expected
    rows = load_raw_corpus(PYTHON_DOCSTRINGS, cache_dir=tmp_path / "cache")
    texts = rows["text"]
    assert texts == stdlib_docstrings() and len(texts) > 1000
    assert all(len(text) >= DOCSTRING_MIN_CHARS for text in texts)


def test_stream_steps_are_the_engines() -> None:
    """data.background counts a run's optimizer steps itself (data/ imports nothing of the engine): the same counts
    as engine.training.train, so exposures and rows_trained describe what the trainer reads."""
    from data.background import steps_per_epoch, total_steps

    for n_rows in (1, 2, 7, 8, 9, 33):
        for batch_size in (1, 3, 4, 8):
            for epochs in (1, 2, 3):
                for max_steps in (0, 1, 5, 7, 100):
                    train = engine_train.TrainConfig(
                        epochs=epochs, batch_size=batch_size, max_steps=max_steps, shuffle=False, progress=False
                    )
                    assert total_steps(n_rows, train) == engine_train.total_steps_of(n_rows, train)
                    assert steps_per_epoch(n_rows, batch_size) == engine_train.steps_per_epoch(n_rows, batch_size)


def test_data_imports_nothing_of_the_other_packages() -> None:
    """The data floor (documents, tokenizing, packing, background streams, exposures) imports no module of goldfish,
    engine or eval: the application hands it the mask as a function."""
    import ast

    root = Path(__file__).resolve().parents[2]
    upward = []
    for path in sorted((root / "data").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            upward += [f"{path.name}: {n}" for n in names if n.split(".")[0] in ("goldfish", "engine", "eval")]
    assert upward == []


# A background run's data, from the corpus on disk to the rows the trainer takes, built with data/ alone: the
# modules loaded on the way are listed at the end.
_DATA_FLOOR_WALK = """
import json, random, sys
from dataclasses import dataclass
from pathlib import Path

import data
from data.background import BackgroundSpec, build_background, load_background
from data.rows import RowMask, pack_documents

@dataclass
class Reading:
    batch_size: int = 4
    epochs: int = 1
    max_steps: int = 0
    seed: int = 0

folder = Path(sys.argv[1])
rng = random.Random(0)
words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
texts = [" ".join(rng.choice(words) for _ in range(50)) for _ in range(4)]
documents = [data.Document(id=f"t{i}", text=text, source="t") for i, text in enumerate(texts)]
(folder / "bg.jsonl").write_text("".join(json.dumps({"text": " ".join(rng.choice(words) for _ in range(80))}) + "\\n"
                                         for _ in range(60)))
tokenizer = data.train_bpe_tokenizer([d.text for d in documents], vocab_size=300)
split = data.select_documents(documents, tokenizer, n_train=2, n_heldout=2, seq_len=16, whole_documents=32)
spec = BackgroundSpec(source=str(folder / "bg.jsonl"), seq_len=32, repeats=(1, 3), data_seed=0, val_tokens=128,
                      cache_dir=folder / "cache")
mask = RowMask(drop=lambda targets: targets % 3 == 0, label="every-third-id")
corpus = load_background(spec, tokenizer, progress=False, log=lambda line: None)
stream = build_background(spec, corpus, split.train, split.heldout, tokenizer, mask, Reading(), tokenizer.pad_token_id)
packed, _ = pack_documents(split.train, [1, 3], 32, mask, eos_id=tokenizer.eos_token_id,
                           pad_id=tokenizer.pad_token_id, seed=0)
rows = [*stream.rows, *stream.validation, *packed]
print(json.dumps({
    "rows": len(rows),
    "dropped": int(sum(int(row.dropped.sum()) for row in rows)),
    "exposures": stream.exposures,
    "loaded": sorted({name.split(".")[0] for name in sys.modules} & {"goldfish", "engine", "eval"}),
}))
"""


def test_a_background_runs_data_stays_on_the_data_floor(tmp_path: Path) -> None:
    """Corpus -> tokenized cache -> schedule -> rows with the mask -> exposures, in a fresh process with data/
    alone: no module of goldfish, engine or eval is loaded until the engine takes the rows."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-c", _DATA_FLOOR_WALK, str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    walk = json.loads(done.stdout.strip().splitlines()[-1])
    assert walk["loaded"] == []
    assert walk["rows"] > 0 and walk["dropped"] > 0  # the mask handed in marked targets in the rows
    assert sorted(walk["exposures"].values()) == [0, 0, 1, 3]  # held-out targets 0, the others as inserted
    assert (tmp_path / "cache" / "tokenized").is_dir()


def test_cache_folder_is_the_flag_else_the_variable_else_home(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from goldfish.app.caches import CACHE_VARIABLE, cache_root, dataset_cache

    monkeypatch.delenv(CACHE_VARIABLE)
    assert cache_root() == Path.home() / ".cache" / "goldfish"
    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path / "variable"))
    assert dataset_cache() == tmp_path / "variable" / "datasets"
    assert dataset_cache(str(tmp_path / "flag")) == tmp_path / "flag" / "datasets"
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="is a file, not a folder"):
        dataset_cache(str(tmp_path / "file"))


def test_cache_dir_and_the_variable_place_the_dataset_cache(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """`goldfish train --background` tokenizes the background into --cache-dir (over $GOLDFISH_CACHE_DIR), else
    into $GOLDFISH_CACHE_DIR, under datasets/, keyed by content."""
    from goldfish.app.caches import CACHE_VARIABLE
    from goldfish.app.cli import main

    rng = random.Random(2)
    source = tmp_path / "background.jsonl"
    source.write_text("".join(json.dumps({"text": _text(rng, rng.randrange(20, 120))}) + "\n" for _ in range(60)))
    argv = [
        "train",
        *tiny_run(
            n_train=2,
            seq_len=64,
            vocab_size=400,
            background=source,
            min_doc_tokens=40,
            max_doc_tokens=1000,
            max_steps=2,
            val_tokens=0,
        ),
    ]
    variable, flag = tmp_path / "variable", tmp_path / "flag"
    monkeypatch.setenv(CACHE_VARIABLE, str(variable))
    assert main([*argv, "--out", str(tmp_path / "a"), "--cache-dir", str(flag)]) == 0
    entries = list((flag / "datasets" / "tokenized").iterdir())
    assert len(entries) == 1 and (entries[0] / "manifest.json").is_file()
    assert not variable.exists()  # the flag wins over the variable
    assert main([*argv, "--out", str(tmp_path / "b")]) == 0
    # the same corpus and tokenizer (a BPE trained from the same documents): the same entry, in the variable's folder
    assert [p.name for p in (variable / "datasets" / "tokenized").iterdir()] == [entries[0].name]


def test_a_resume_may_name_another_cache_folder() -> None:
    """The cache folder says where tokenized data is kept, not what the run trains on: a resume may change it."""
    from goldfish.app.config import TrainSpec
    from goldfish.app.resume import shaping_differences

    # a background run trains its stream in order: its recorded training settings have shuffle off
    saved = TrainSpec(data=DataSpec(background="bg.jsonl", cache_dir="/a"))
    saved = replace(saved, train=replace(saved.train, shuffle=False))
    assert shaping_differences(saved, replace(saved, data=replace(saved.data, cache_dir="/b"))) == []
    assert shaping_differences(saved, replace(saved, data=replace(saved.data, val_tokens=0))) != []
