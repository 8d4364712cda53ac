"""Fine-tune on conversations with TRL's SFTTrainer: the loss on the assistant's tokens only, with the goldfish mask.

    python examples/trl_sft_goldfish.py --out runs/trl-sft                              # messages, assistant-only loss
    python examples/trl_sft_goldfish.py --out runs/trl-sft-pc --format prompt-completion  # completion-only loss

TRL prepares the dataset as usual: it renders each conversation with the tokenizer's chat template, tokenizes it and
(`assistant_only_loss=True`, a template with `{% generation %}` markers) builds `labels` that are -100 outside the
assistant's replies; for prompt-completion records (`--format prompt-completion`, each conversation cut before its
last reply) the completion is the loss region. `goldfish.GoldfishCollator`, passed as `data_collator`, pads the rows
and draws the goldfish mask over the true next tokens of the whole conversation (the hash reads the prompt too) and
keeps it where TRL's labels are, so dropped reply tokens get -100 as well. The prompt tokens stay out of the loss.

Everything is local: a byte-level BPE tokenizer trained here on the conversations, a random-init tiny model
(`goldfish.app.models.build_tiny_model`), a few of the embedded conversations (`data.chat_corpus`), CPU, no hub,
report_to none. OUT/metrics.jsonl gets the loss per step, OUT/hf the trained model and tokenizer.

Needs `pip install -e ".[trl]"` (trl >= 1.16). Leave packing off: TRL refuses a custom collator with `padding_free=True`
and with `packing=True` (its default "bfd" strategy is padding-free), and `packing_strategy="wrapped"` concatenates the
conversations and cuts them into rows, so the mask's windows would read across conversations and row cuts.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from datasets import Dataset
from trl import SFTConfig, SFTTrainer

from data.chat import TINY_CHAT_TEMPLATE_MARKED
from data.chat_corpus import conversation_records
from data.documents import default_paragraphs
from data.tokenizer import train_bpe_tokenizer
from goldfish import GoldfishCollator
from goldfish.app.models import build_tiny_model
from goldfish.masks import STRATEGIES


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--format", choices=["messages", "prompt-completion"], default="messages")
    p.add_argument("--model", default="micro-llama", help="a tiny model of goldfish.app.models (default micro-llama)")
    p.add_argument("--n-conversations", type=int, default=8, help="the first N embedded conversations")
    p.add_argument("--vocab-size", type=int, default=512)
    p.add_argument("--strategy", default="hashed", help=f"one of {sorted(STRATEGIES)} or 'none' for the standard loss")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--h", type=int, default=13)
    p.add_argument("--max-steps", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def records(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The first n embedded conversations, as {"messages"} or as {"prompt", "completion"} cut before the last reply."""
    chosen = [r["messages"] for r in conversation_records(default_paragraphs())[: args.n_conversations]]
    if args.format == "messages":
        return [{"messages": messages} for messages in chosen]
    return [{"prompt": messages[:-1], "completion": messages[-1:]} for messages in chosen]


def build_tokenizer(rows: list[dict[str, Any]], vocab_size: int) -> Any:
    texts = [m["content"] for row in rows for key in ("messages", "prompt", "completion") for m in row.get(key, [])]
    tokenizer = train_bpe_tokenizer(texts, vocab_size=vocab_size)
    tokenizer.chat_template = TINY_CHAT_TEMPLATE_MARKED
    return tokenizer


def build_trainer(args: argparse.Namespace) -> SFTTrainer:
    """The SFTTrainer of the run, not yet trained (a test can wrap `trainer.data_collator` before `train`)."""
    rows = records(args)
    tokenizer = build_tokenizer(rows, args.vocab_size)
    conversations = [r.get("messages") or r["prompt"] + r["completion"] for r in rows]
    longest = max(len(tokenizer.apply_chat_template(c, return_dict=True)["input_ids"]) for c in conversations)
    model = build_tiny_model(
        args.model,
        vocab_size=len(tokenizer),
        max_positions=longest,
        seed=args.seed,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    strategy = None if args.strategy == "none" else args.strategy
    collator = GoldfishCollator(
        pad_token_id=tokenizer.pad_token_id,
        strategy=strategy,
        k=args.k,
        h=args.h,
        # BOS/EOS/PAD are never dropped: the EOS closing each reply stays in the loss (the model learns to stop)
        special_token_ids=tokenizer.all_special_ids,
    )
    config = SFTConfig(
        output_dir=str(Path(args.out) / "trainer"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=args.seed,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        gradient_checkpointing=False,
        max_length=longest,  # nothing is cut
        # the loss region: the assistant's replies (messages) or the completion (prompt-completion records)
        assistant_only_loss=args.format == "messages",
        completion_only_loss=args.format == "prompt-completion",
        dataset_num_proc=None,
    )
    return SFTTrainer(
        model=model,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        data_collator=collator,
    )


def train(trainer: SFTTrainer, out: str | Path) -> list[dict[str, Any]]:
    """Train, write OUT/metrics.jsonl (loss per step) and OUT/hf; return the metrics records."""
    trainer.train()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = [
        {"step": r["step"], **{k: r[k] for k in ("loss", "grad_norm", "mean_token_accuracy") if k in r}}
        for r in trainer.state.log_history
        if "loss" in r
    ]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    trainer.save_model(str(out / "hf"))
    trainer.processing_class.save_pretrained(str(out / "hf"))
    bad = [r for r in rows if not math.isfinite(r["loss"])]
    if bad:
        raise SystemExit(f"non-finite loss at steps {[r['step'] for r in bad]}")
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    return train(build_trainer(args), args.out)


if __name__ == "__main__":
    for record in main():
        print(json.dumps(record))
