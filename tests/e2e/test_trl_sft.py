"""examples/trl_sft_goldfish.py: TRL's SFTTrainer with GoldfishCollator trains on the assistant's tokens only, with the
goldfish mask drawn over the whole conversation's true next tokens.

Each batch the collator hands the model is checked against references computed here: the loss region from our own
reply locator (data.chat.render_conversation with TINY_CHAT_TEMPLATE, not TRL's `{% generation %}` mask), and the
dropped positions from `drop_mask` over the row's true targets (prompt included). Runtime on the project's 2-core
machine, one thread: about 7 s for both formats (5 s of it in the two runs).
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl", reason="needs the trl extra: pip install -e '.[trl]'")

from conventions import IGNORE_INDEX  # noqa: E402
from data.chat import TINY_CHAT_TEMPLATE, Message, assistant_flags, render_conversation  # noqa: E402
from data.chat_corpus import conversation_records  # noqa: E402
from data.documents import default_paragraphs  # noqa: E402
from goldfish.masks import drop_mask  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def example():
    return load_example("trl_sft_goldfish")


def reference_regions(tokenizer, n_conversations: int, fmt: str) -> dict[tuple[int, ...], list[bool]]:
    """token ids of each conversation -> which tokens are in the loss, by data.chat's reply locator: every reply
    (messages) or the last one (prompt-completion: the completion)."""
    tokenizer.chat_template = TINY_CHAT_TEMPLATE
    regions = {}
    for record in conversation_records(default_paragraphs())[:n_conversations]:
        messages = tuple(Message(m["role"], m["content"]) for m in record["messages"])
        rendered = render_conversation(tokenizer, messages, record["id"])
        replies = rendered.replies if fmt == "messages" else rendered.replies[-1:]
        regions[tuple(rendered.ids)] = assistant_flags(len(rendered.ids), replies)
    return regions


@pytest.mark.parametrize("fmt", ["messages", "prompt-completion"])
def test_sft_trainer_batches_have_goldfish_labels_on_assistant_tokens(example, fmt: str, tmp_path: Path) -> None:
    args = example.parse_args(["--out", str(tmp_path), "--format", fmt, "--max-steps", "4", "--k", "4", "--h", "13"])
    trainer = example.build_trainer(args)
    collator = trainer.data_collator
    seen = []

    def recording(features):
        batch = collator(features)
        seen.append(([{key: list(value) for key, value in f.items()} for f in features], batch))
        return batch

    trainer.data_collator = recording
    records = example.train(trainer, args.out)

    # training ran the steps, with finite losses, and wrote them
    assert trainer.state.global_step == args.max_steps
    assert [r["step"] for r in records] == list(range(1, args.max_steps + 1))
    assert all(math.isfinite(r["loss"]) for r in records)
    assert [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == records
    assert (tmp_path / "hf" / "config.json").is_file()
    assert len(seen) == args.max_steps

    tokenizer = trainer.processing_class
    special = tokenizer.all_special_ids
    regions = reference_regions(tokenizer, args.n_conversations, fmt)
    counts = {"kept": 0, "dropped": 0, "dropped_in_first_window": 0}
    for features, batch in seen:
        assert set(batch) == {"input_ids", "attention_mask", "labels"}
        for i, feature in enumerate(features):
            ids = feature["input_ids"]
            n = len(ids)
            region = regions.get(tuple(ids))
            assert region is not None, "TRL tokenized a conversation differently from data.chat's rendering"
            assert batch["input_ids"][i, :n].tolist() == ids
            assert batch["attention_mask"][i].tolist() == [1] * n + [0] * (batch["input_ids"].shape[1] - n)
            # dropped[j - 1]: is the target ids[j] (predicted at j - 1) dropped? Drawn over the true targets.
            dropped = drop_mask(torch.tensor(ids[1:]).unsqueeze(0), "hashed", 4, 13, special_token_ids=special)[0]
            expected = [IGNORE_INDEX] * n
            for j in range(1, n):
                if region[j]:
                    if dropped[j - 1]:
                        counts["dropped"] += 1
                        # the window of this target reaches back before the reply: only the prompt-reading hash
                        # drops it (a mask drawn over the labels alone keeps a window holding -100)
                        start = j
                        while start > 0 and region[start - 1]:
                            start -= 1
                        counts["dropped_in_first_window"] += int(j - start < 12)
                    else:
                        expected[j] = ids[j]
                        counts["kept"] += 1
            labels = batch["labels"][i].tolist()
            assert labels[:n] == expected, f"row {i}: labels differ from the region's goldfish labels"
            assert all(label == IGNORE_INDEX for label in labels[n:])
    # the mask did something, at about 1 in k of the region's targets, and read the prompt
    total = counts["kept"] + counts["dropped"]
    assert 0.1 < counts["dropped"] / total < 0.4, counts
    assert counts["dropped_in_first_window"] > 0, counts
