"""`goldfish train`, `eval` and `mask` on conversations: the loss covers the assistant's tokens only, extraction runs
reply by reply, bad conversations are refused in one line before any work."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from tiny_runs import tiny_run

from data.chat import TINY_CHAT_TEMPLATE_MARKED
from data.chat_corpus import conversation_records
from data.documents import default_paragraphs
from goldfish.app.cli import main


def write_conversations(path: Path, records: list[dict]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path


def test_train_on_conversations_puts_the_loss_on_assistant_tokens_only(tmp_path, capsys):
    """The number of targets training counts equals the assistant tokens that transformers' own assistant mask
    (the tiny template with {% generation %} markers) finds in the training conversations; eval then extracts each
    reply and reports its statistics."""
    from transformers import AutoTokenizer

    source = write_conversations(tmp_path / "chats.jsonl", conversation_records(default_paragraphs())[:24])
    run = tmp_path / "run"
    argv = tiny_run(data=source, id_field="id", n_train=4, n_heldout=2, seq_len=256, vocab_size=400, epochs=1)
    assert main(["train", "--out", str(run), *argv, "--strategy", "hashed", "--k", "3"]) == 0
    printed = capsys.readouterr().out
    dropped, targets = map(int, re.search(r"(\d+)/(\d+) targets dropped", printed).groups())

    tokenizer = AutoTokenizer.from_pretrained(run / "checkpoint")
    assert tokenizer.chat_template  # saved with the checkpoint
    tokenizer.chat_template = TINY_CHAT_TEMPLATE_MARKED
    record = json.loads((run / "checkpoint" / "goldfish_run.json").read_text())
    by_id = {r["id"]: r["messages"] for r in conversation_records(default_paragraphs())}
    trained = [by_id[d["id"]] for d in record["documents"]["train"]]
    counted = 0
    for messages in trained:
        encoded = tokenizer.apply_chat_template(messages, return_dict=True, return_assistant_tokens_mask=True)
        counted += sum(encoded["assistant_masks"][1:])  # token j is a target of position j - 1
    assert targets == counted and 0 < dropped < targets

    out = tmp_path / "eval"
    assert (
        main(["eval", "--model", str(run / "checkpoint"), "--out", str(out), "--suffix-len", "8", "--no-progress"]) == 0
    )
    summary = json.loads((out / "summary.json").read_text())
    replies = summary["train"]["replies"]
    assert replies["n_extracted"] == sum(m["role"] == "assistant" for c in trained for m in c)
    assert replies["statistics"]["n_conversations"] == 4
    rows = [json.loads(line) for line in (out / "train" / "extraction.jsonl").read_text().splitlines()]
    assert all("#reply" in row["id"] for row in rows)
    assert "## Replies" in (out / "report.md").read_text()


def test_bad_conversations_are_one_line_before_any_work(tmp_path, capsys):
    no_assistant = write_conversations(tmp_path / "a.jsonl", [{"messages": [{"role": "user", "content": "Hi"}]}] * 4)
    assert main(["train", "--out", str(tmp_path / "r1"), *tiny_run(data=no_assistant)]) == 2
    err = capsys.readouterr().err
    assert "no assistant turn" in err and len(err.strip().splitlines()) == 1

    unknown = write_conversations(
        tmp_path / "b.jsonl", [{"messages": [{"role": "robot", "content": "x"}, {"role": "assistant", "content": "y"}]}]
    )
    assert main(["train", "--out", str(tmp_path / "r2"), *tiny_run(data=unknown)]) == 2
    assert "unknown role 'robot'" in capsys.readouterr().err

    # a tokenizer without a chat template (here: the plain BPE saved by a text run) is refused
    text_docs = tmp_path / "docs.jsonl"
    text_docs.write_text("\n".join(json.dumps({"text": f"word{i} " * 60}) for i in range(8)) + "\n")
    assert main(["train", "--out", str(tmp_path / "text"), *tiny_run(data=text_docs, epochs=1, dedup="off")]) == 0
    capsys.readouterr()
    chats = write_conversations(tmp_path / "c.jsonl", conversation_records(default_paragraphs())[:8])
    tokenizer = str(tmp_path / "text" / "checkpoint")
    assert main(["train", "--out", str(tmp_path / "r3"), *tiny_run(data=chats, tokenizer=tokenizer)]) == 2
    assert "no chat template" in capsys.readouterr().err
    assert not (tmp_path / "r3" / "checkpoint").exists()


def test_mask_shows_a_conversation(tmp_path, capsys):
    chats = write_conversations(tmp_path / "c.jsonl", conversation_records(default_paragraphs())[:4])
    assert main(["mask", "--conversation", str(chats), "--record", "4", "--no-color"]) == 0
    out = capsys.readouterr().out
    assert "<|assistant|>" in out and "reply targets (the loss covers the assistant's replies only)" in out
    assert "[[" not in out.split("<|assistant|>")[0]  # nothing of the prompt is dropped


@pytest.mark.slow
def test_chat_preset_standard_reproduces_replies_and_goldfish_does_not(tmp_path):
    """The shipped `goldfish compare --preset chat` run (bench/results/compare_chat): about 3 minutes on 2 cores."""
    out = tmp_path / "chat"
    assert main(["compare", "--preset", "chat", "--out", str(out), "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    stats = {label: parts["train"]["replies"]["statistics"] for label, parts in summary["details"].items()}
    standard, goldfish = stats["standard"]["exact_match"], stats["goldfish-hashed-k4-h13"]["exact_match"]
    assert standard["exact_ci"][0] > goldfish["exact_ci"][1]  # the intervals do not overlap
    assert (
        stats["goldfish-hashed-k4-h13"]["tf_kept_accuracy"]["mean"]
        > 0.9
        > 0.5
        > (stats["goldfish-hashed-k4-h13"]["tf_dropped_accuracy"]["mean"])
    )
    assert "## Replies" in (out / "report.md").read_text()
