"""Fine-tune with the goldfish loss in the HF Trainer, two ways.

    python examples/hf_trainer_goldfish.py --out runs/trainer                       # (a) GoldfishCollator
    python examples/hf_trainer_goldfish.py --out runs/trainer --loss compute-loss   # (b) compute_loss override

(a) the stock Trainer with `goldfish.GoldfishCollator`: the collator writes -100 into the labels of dropped
    targets, and the model's own loss averages the kept ones. Nothing else changes.
(b) `GoldfishTrainer`, a Trainer whose compute_loss calls `goldfish.goldfish_loss` and logs, next to the
    kept-token loss, the loss over all targets and over the dropped ones (`all_loss`, `dropped_loss`), as
    `goldfish train` does.

The dataset holds one column, `input_ids` (the Trainer keeps only columns the model's forward takes:
input_ids, attention_mask, labels). To compare with `goldfish train`, the documents, tokenizer, model init
and mask are that command's, and the rows are laid out in its batch order (every epoch's shuffle, in one
sequential pass). OUT/metrics.jsonl gets the loss per step, OUT/hf the trained model.

Needs `pip install -e ".[hf]"` (the Trainer requires accelerate).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from goldfish_train_options import add_goldfish_train_options, documents_and_mask  # examples/goldfish_train_options.py
from transformers import Trainer, TrainingArguments

import engine.training.train as engine_train
from conventions import IGNORE_INDEX
from goldfish import GoldfishCollator, causal_targets, goldfish_loss
from goldfish.app.model_files import initial_model


class GoldfishTrainer(Trainer):
    """A Trainer whose loss is goldfish_loss, logging kept (`loss`), all-target and dropped-target losses.

    Takes the batches of a GoldfishCollator (labels = -100 at dropped and padded targets); the dropped
    targets are those with a real next token whose label the collator removed.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sums = torch.zeros(4, dtype=torch.float64)  # all-target CE sum, count, dropped CE sum, count

    def compute_loss(
        self,
        model: torch.nn.Module,
        inputs: dict[str, torch.Tensor],
        return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> Any:
        outputs = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
        targets = causal_targets(inputs["input_ids"], inputs["attention_mask"])  # (B, T)
        kept_labels = torch.full_like(targets, IGNORE_INDEX)
        kept_labels[:, :-1] = inputs["labels"][:, 1:]  # (B, T), aligned with targets
        dropped = (targets != IGNORE_INDEX) & (kept_labels == IGNORE_INDEX)
        result = goldfish_loss(outputs.logits, targets, dropped)
        if model.training:
            self._sums += torch.tensor(
                [
                    float(result.all_loss) * result.n_all,
                    result.n_all,
                    float(result.dropped_loss) * result.n_dropped if result.n_dropped else 0.0,
                    result.n_dropped,
                ],
                dtype=torch.float64,
            )
        # The Trainer counts the kept targets of the whole optimizer step (all micro-batches) and passes them
        # in: dividing by it gives the step's mean over kept targets, as goldfish train does.
        loss = result.loss_sum / (num_items_in_batch if num_items_in_batch is not None else max(result.n_kept, 1))
        return (loss, outputs) if return_outputs else loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self._sums[1] > 0:  # a training log: add the losses since the last one
            logs["all_loss"] = float(self._sums[0] / self._sums[1])
            logs["dropped_loss"] = float(self._sums[2] / self._sums[3]) if self._sums[3] > 0 else None
            self._sums.zero_()
        super().log(logs, start_time)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--loss", choices=["collator", "compute-loss"], default="collator")
    add_goldfish_train_options(p)
    return p.parse_args(argv)


def goldfish_train_order(n_examples: int, epochs: int, batch_size: int, seed: int) -> list[int]:
    """The rows of every step of `goldfish train`, epoch after epoch (its order is a function of seed and epoch)."""
    return [i for epoch in range(epochs) for i in engine_train.epoch_order(n_examples, seed, epoch).tolist()]


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    if args.batch_size % args.grad_accum:
        raise SystemExit(f"--batch-size {args.batch_size} must be a multiple of --grad-accum {args.grad_accum}")
    prepared, mask = documents_and_mask(args)
    tokenizer, documents = prepared.tokenizer, prepared.split.train
    if len(documents) % args.batch_size:
        raise SystemExit(
            f"--n-train {len(documents)} must be a multiple of --batch-size {args.batch_size} for the "
            "sequential layout of goldfish train's batches"
        )
    order = goldfish_train_order(len(documents), args.epochs, args.batch_size, args.seed)
    dataset = Dataset.from_dict({"input_ids": [documents[i].token_ids for i in order]})
    collator = GoldfishCollator(
        pad_token_id=tokenizer.pad_token_id,
        strategy=mask.strategy,
        k=mask.k,
        h=mask.h,
        special_token_ids=prepared.special_token_ids,
    )
    model = initial_model(args.model, prepared, args.init_seed)
    training = TrainingArguments(
        output_dir=str(Path(args.out) / "trainer"),
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=args.seed,
        num_train_epochs=1,
        train_sampling_strategy="sequential",  # the epochs are laid out in the dataset
        per_device_train_batch_size=args.batch_size // args.grad_accum,
        gradient_accumulation_steps=args.grad_accum,
        # goldfish train's optimizer: AdamW(0.9, 0.95) or plain SGD, constant lr, no weight decay, clipping at 1.0
        learning_rate=args.lr,
        adam_beta1=0.9,
        adam_beta2=0.95,
        weight_decay=0.0,
        lr_scheduler_type="constant",
        max_grad_norm=args.max_grad_norm,
        optim="sgd" if args.optimizer == "sgd" else "adamw_torch",
    )
    trainer_class = GoldfishTrainer if args.loss == "compute-loss" else Trainer
    trainer = trainer_class(model=model, args=training, train_dataset=dataset, data_collator=collator)
    trainer.train()

    out = Path(args.out)
    records = [
        {"step": r["step"], **{k: r[k] for k in ("loss", "all_loss", "dropped_loss", "grad_norm") if k in r}}
        for r in trainer.state.log_history
        if "loss" in r
    ]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    trainer.save_model(str(out / "hf"))
    tokenizer.save_pretrained(str(out / "hf"))
    return records


if __name__ == "__main__":
    main()
