"""`goldfish audit` end to end on models trained here: a goldfish model's training documents show kept accuracy far
above dropped accuracy and the gap tells them from documents it never saw; a standard model shows no gap, nor does the
goldfish model audited with another mask; bad input is one line (exit 2) before the model loads."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from tiny_runs import tiny_run

from goldfish.app.cli import main

SEQ_LEN = 64  # tokens trained per document (the audit cuts documents alike: --max-tokens)
MASK = "hashed:4:13"
WRONG_MASKS = ("hashed:4:7", "hashed-reference:4:13")  # another window, another hash


def _documents() -> list[dict[str, str]]:
    """16 documents of random words from a small vocabulary: nothing of one predicts another, so a model can know a
    document's tokens only by having trained on them."""
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = sorted({"".join(rng.choice(letters) for _ in range(rng.choice([2, 3]))) for _ in range(200)})[:64]
    return [{"id": f"d{i}", "text": " ".join(rng.choice(words) for _ in range(70))} for i in range(16)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A goldfish (MASK) and a standard micro-llama trained 60 epochs on the same 8 documents (8 more held out),
    and the members / non-members files taken from the goldfish run's record."""
    root = tmp_path_factory.mktemp("audit")
    records = _documents()
    source = root / "docs.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    common = tiny_run(
        data=source,
        id_field="id",
        n_train=8,
        n_heldout=8,
        seq_len=SEQ_LEN,
        vocab_size=400,
        batch_size=4,
        epochs=60,
        lr=3e-3,
    )
    strategy, k, h = MASK.split(":")
    assert main(["train", "--out", str(root / "goldfish"), *common, "--strategy", strategy, "--k", k, "--h", h]) == 0
    assert main(["train", "--out", str(root / "standard"), *common, "--strategy", "standard"]) == 0
    run = json.loads((root / "goldfish" / "run.json").read_text())
    by_id = {r["id"]: r for r in records}
    files = {"root": root, "source": source}
    for part, name in (("train", "members"), ("heldout", "nonmembers")):
        files[name] = root / f"{name}.jsonl"
        files[name].write_text("".join(json.dumps(by_id[d["id"]]) + "\n" for d in run["documents"][part]))
    files["goldfish"], files["standard"] = root / "goldfish" / "checkpoint", root / "standard" / "checkpoint"
    return files


def _audit(trained: dict[str, Path], model: str, mask: str, out: Path, *extra: str) -> int:
    return main(
        [
            "audit",
            "--model",
            str(trained[model]),
            "--mask",
            mask,
            "--data",
            str(trained["members"]),
            "--nonmembers",
            str(trained["nonmembers"]),
            "--id-field",
            "id",
            "--max-tokens",
            str(SEQ_LEN),
            "--suffix-len",
            "16",
            "--bootstrap",
            "200",
            "--out",
            str(out),
            "--no-progress",
            "--threads",
            "1",
            *extra,
        ]
    )


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def test_goldfish_members_show_the_gap_and_it_separates_them(trained, tmp_path, capsys):
    out = tmp_path / "audit"
    assert _audit(trained, "goldfish", MASK, out) == 0
    assert "gap as membership score" in capsys.readouterr().out
    summary = _summary(out)
    members, nonmembers = summary["members"], summary["nonmembers"]
    print(
        "goldfish, own mask: members kept/dropped",
        members["kept_accuracy"]["mean"],
        members["dropped_accuracy"]["mean"],
        "non-members",
        nonmembers["kept_accuracy"]["mean"],
        nonmembers["dropped_accuracy"]["mean"],
        "gap AUC",
        summary["membership"]["attacks"]["mask_gap"]["auc"],
    )
    assert members["n_docs"] == nonmembers["n_docs"] == 8
    assert members["kept_accuracy"]["mean"] > 0.9 and members["dropped_accuracy"]["mean"] < 0.3
    assert members["gap"]["ci"][0] > 0.5 and members["n_gap_above_zero"] == 8
    assert abs(nonmembers["gap"]["mean"]) < 0.15
    gap = summary["membership"]["attacks"]["mask_gap"]
    assert gap["auc"] > 0.9 and gap["auc_ci"][0] <= gap["auc"] <= gap["auc_ci"][1]
    assert gap["tpr_at_fpr"]["0.01"] is not None and gap["tpr_at_fpr_ci"]["0.01"] is not None
    assert {"loss", "zlib", "min_k", "mask_loss_gap"} <= set(summary["membership"]["attacks"])
    # greedy continuations of members leave the text at dropped targets far more often than 1/k
    divergence = members["divergence"]
    assert divergence["base_rate"] == 0.25 and divergence["share_on_dropped"] > 0.5
    # at most a rare leak: a 16-token suffix keeps all its targets with probability 0.75^16 (about 1%) and a dropped
    # token can be guessed from its neighbours; the tokenizer fitted on these 8 documents alone leaves 1 of 8 here
    assert members["extraction"]["n_exact_match"] <= 1
    rows = [json.loads(line) for line in (out / "audit.jsonl").read_text().splitlines()]
    assert len(rows) == 16 and sum(r["member"] for r in rows) == 8
    assert all(r["n_tokens"] == SEQ_LEN and r["n_windows"] == 1 for r in rows)
    assert {"gap", "gap_ci", "kept_loss", "dropped_loss", "longest_span", "first_divergence"} <= set(rows[0])
    report = (out / "report.md").read_text()
    assert "mask_gap" in report and "gap_hist.png" in report and (out / "gap_hist.png").stat().st_size > 0
    assert summary["mask"]["spec"] == MASK and summary["special_token_ids"]


def test_standard_model_has_no_gap(trained, tmp_path):
    out = tmp_path / "audit"
    assert _audit(trained, "standard", MASK, out) == 0
    summary = _summary(out)
    members, nonmembers = summary["members"], summary["nonmembers"]
    print("standard: members gap", members["gap"]["mean"], "non-members gap", nonmembers["gap"]["mean"])
    assert members["kept_accuracy"]["mean"] > 0.9 and members["dropped_accuracy"]["mean"] > 0.9  # memorized all
    assert abs(members["gap"]["mean"]) < 0.1 and abs(nonmembers["gap"]["mean"]) < 0.1
    assert members["n_gap_above_zero"] == 0
    attacks = summary["membership"]["attacks"]
    print("standard: gap AUC", attacks["mask_gap"]["auc"], "loss AUC", attacks["loss"]["auc"])
    assert attacks["mask_gap"]["auc"] < 0.8 and attacks["loss"]["auc"] > 0.9  # the loss separates, the gap does not


@pytest.mark.parametrize("wrong", WRONG_MASKS)
def test_another_mask_shows_no_gap(trained, tmp_path, wrong):
    out = tmp_path / "audit"
    assert _audit(trained, "goldfish", wrong, out, "--bootstrap", "0") == 0
    members = _summary(out)["members"]
    print(
        f"goldfish against {wrong}: members kept/dropped",
        members["kept_accuracy"]["mean"],
        members["dropped_accuracy"]["mean"],
    )
    assert abs(members["gap"]["mean"]) < 0.15
    assert members["n_gap_above_zero"] <= 1


def test_overwrite_replaces_an_earlier_audit(trained, tmp_path, capsys):
    out = tmp_path / "audit"
    (out / "notes.txt").parent.mkdir()
    (out / "notes.txt").write_text("mine")
    assert _audit(trained, "goldfish", MASK, out, "--bootstrap", "0", "--max-docs", "2") == 2
    assert "not empty" in capsys.readouterr().err
    assert _audit(trained, "goldfish", MASK, out, "--bootstrap", "0", "--max-docs", "2", "--overwrite") == 0
    assert (out / "notes.txt").read_text() == "mine" and _summary(out)["members"]["n_docs"] == 2


def _bad(trained: dict[str, Path], tmp_path: Path) -> list[tuple[list[str], str]]:
    members = str(trained["members"])
    copy = tmp_path / "copy.jsonl"
    copy.write_text(trained["members"].read_text())
    return [
        (["--mask", "standard"], "standard loss drops no target"),
        (["--mask", "random:4"], "random mask"),
        (["--mask", "hashed:1:13"], "k must be"),
        (["--mask", "bogus:4"], "unknown mask strategy"),
        (["--mask", "hashed:4:80"], "shorter than 81 tokens"),
        (["--data", str(tmp_path / "missing.jsonl")], "missing.jsonl"),
        (["--nonmembers", members], "is the --data source"),
        (["--nonmembers", str(copy)], "also in --data"),
        (["--model", "micro-llama"], "random init"),
        (["--model", str(tmp_path / "no" / "such")], "no such folder"),
        (["--suffix-len", "80"], "needs documents of at least 81 tokens"),
    ]


def test_bad_input_is_one_line_before_the_model_loads(trained, tmp_path, capsys, monkeypatch):
    import goldfish.app.audit as audit

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded before the settings were checked")

    monkeypatch.setattr(audit, "_load_model", never)
    base = {"--model": str(trained["goldfish"]), "--mask": MASK, "--data": str(trained["members"])}
    for changed, message in _bad(trained, tmp_path):
        settings = base | dict(zip(changed[::2], changed[1::2]))
        argv = ["audit", *[w for pair in settings.items() for w in pair], "--out", str(tmp_path / "out")]
        argv += ["--id-field", "id", "--max-tokens", str(SEQ_LEN), "--no-progress"]
        assert main(argv) == 2, changed
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, (changed, err)
        assert not (tmp_path / "out").exists(), changed
    with pytest.raises(SystemExit) as stopped:  # a malformed value: argparse's one line
        main(["audit", *[w for pair in base.items() for w in pair], "--out", str(tmp_path / "out"), "--max-docs", "-1"])
    assert stopped.value.code == 2 and "--max-docs: must be >= 0" in capsys.readouterr().err
