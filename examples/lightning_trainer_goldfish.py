"""Train with the goldfish loss in a LightningModule, with the Lightning Trainer on the engine's 4-D grid.

    torchrun --standalone --nproc-per-node 2 examples/lightning_trainer_goldfish.py --grid x=2 --out runs/trainer-pl
    python examples/lightning_trainer_goldfish.py --devices 2 --grid x=2 --out runs/trainer-pl   # Lightning launches

Same documents, model init, mask, batch order, optimizer and schedule as `goldfish train` with the same options
(the sampler hands each process its own rows of every `goldfish train` step), so OUT/metrics.jsonl holds the same
loss per step. ModelCheckpoint writes engine checkpoints to OUT/checkpoints/epoch=N every --save-every epochs;
--resume continues from one exactly. After training, OUT/checkpoints/final is consolidated into OUT/hf, an ordinary
HF folder (the HF model inside the LightningModule, under its own key names).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any, Iterator

import lightning as L
import torch
from goldfish_train_options import (  # examples/goldfish_train_options.py
    add_goldfish_train_options,
    documents_and_mask,
    train_config,
)
from lightning.pytorch.callbacks import ModelCheckpoint

import engine.training.train as engine_train
from data.batch import Row
from engine.integrations.lightning_trainer import EngineTrainerStrategy
from engine.training.checkpoint import consolidate_checkpoint
from goldfish import IGNORE_INDEX, goldfish_loss
from goldfish.app.config import parse_grid
from goldfish.app.model_files import initial_model
from goldfish.app.training_rows import chat_row_of, make_examples


class GoldfishStepSampler(torch.utils.data.Sampler):
    """Yields (micro-batch rows, all rows of its step) for this process, epoch by epoch in goldfish train's order.
    The Trainer calls set_epoch at the start of each epoch (also after a resume)."""

    def __init__(self, n_examples: int, config: engine_train.TrainConfig, rank: int, world: int) -> None:
        self.n, self.config, self.rank, self.world, self.epoch = n_examples, config, rank, world, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return engine_train.steps_per_epoch(self.n, self.config.batch_size) * self.config.grad_accum

    def __iter__(self) -> Iterator[tuple[list[int], list[int]]]:
        order = engine_train.epoch_order(self.n, self.config.seed, self.epoch)
        for start in range(0, self.n, self.config.batch_size):
            step_rows = order[start : start + self.config.batch_size]
            share = len(step_rows) // self.world
            mine = step_rows[self.rank * share : (self.rank + 1) * share]
            for micro in torch.tensor_split(mine, self.config.grad_accum):
                yield micro.tolist(), step_rows.tolist()


class StepDataset(torch.utils.data.Dataset):
    """Micro-batches of goldfish examples (input_ids, targets, dropped), with the kept-target count of their step."""

    def __init__(self, examples: list[Row]) -> None:
        self.examples = examples

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, item: tuple[list[int], list[int]]) -> dict[str, torch.Tensor]:
        rows, step_rows = item
        batch = {
            key: torch.stack([getattr(self.examples[i], key) for i in rows])
            for key in ("input_ids", "targets", "dropped")
        }
        batch["step_kept"] = torch.tensor(
            sum(int((~self.examples[i].dropped & (self.examples[i].targets != IGNORE_INDEX)).sum()) for i in step_rows)
        )
        return batch


class GoldfishModule(L.LightningModule):
    def __init__(
        self,
        model: torch.nn.Module,
        examples: list[dict[str, torch.Tensor]],
        config: engine_train.TrainConfig,
        final_checkpoint: Path,
    ) -> None:
        super().__init__()
        self.model, self.examples, self.config = model, examples, config
        self.final_checkpoint = final_checkpoint
        self.records: list[dict[str, Any]] = []
        self._sums = torch.zeros(5, dtype=torch.float64)  # kept CE, all CE, all n, dropped CE, dropped n
        self._pending: dict[str, Any] | None = None

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        sampler = GoldfishStepSampler(len(self.examples), self.config, self.global_rank, self.trainer.world_size)
        return torch.utils.data.DataLoader(StepDataset(self.examples), batch_size=None, sampler=sampler)

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = engine_train.make_optimizer(self.model, self.config)  # runs after the strategy sharded the model
        total = self.config.epochs * engine_train.steps_per_epoch(len(self.examples), self.config.batch_size)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: engine_train.lr_factor(s, total, self.config)
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        result = goldfish_loss(self.model(input_ids=batch["input_ids"]).logits, batch["targets"], batch["dropped"])
        self._sums += torch.tensor(
            [
                float(result.loss_sum.detach()),
                float(result.all_loss) * result.n_all,
                result.n_all,
                float(result.dropped_loss) * result.n_dropped if result.n_dropped else 0.0,
                result.n_dropped,
            ],
            dtype=torch.float64,
        )
        # The Trainer divides by accumulate_grad_batches and the strategy averages over processes: scale so that
        # the step's gradient is that of the mean over every kept target of the step.
        scale = self.trainer.world_size * self.trainer.accumulate_grad_batches / float(batch["step_kept"])
        return result.loss_sum * scale

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        sums = self.trainer.strategy.reduce(self._sums.clone(), reduce_op="sum")
        self._sums.zero_()
        self._pending = {"sums": sums, "lr": optimizer.param_groups[0]["lr"]}

    def on_train_end(self) -> None:
        # The final weights, written while the strategy's grid still exists (it closes when fit returns).
        self.trainer.save_checkpoint(self.final_checkpoint)

    def on_train_batch_end(self, outputs: Any, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        if self._pending is None:
            return  # a micro-batch before the last of its step
        sums, n_kept = self._pending["sums"], float(batch["step_kept"])
        norm = self.trainer.strategy.last_grad_norm
        self.records.append(
            {
                "step": self.trainer.global_step,
                "loss": float(sums[0]) / n_kept,
                "all_loss": float(sums[1] / sums[2]),
                "dropped_loss": float(sums[3] / sums[4]) if sums[4] else None,
                "lr": self._pending["lr"],
                "grad_norm": None if norm is None else float(norm),
            }
        )
        self._pending = None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--grid", default="", help="engine grid, e.g. x=2,y=2 (data fills the rest of the world)")
    p.add_argument("--devices", type=int, default=int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    add_goldfish_train_options(p)
    p.add_argument("--save-every", type=int, default=1, help="checkpoint every N epochs")
    p.add_argument("--resume", default=None, help="an OUT/checkpoints/epoch=N folder of a run with the same options")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    config = train_config(args)
    prepared, mask = documents_and_mask(args, log=lambda *a: None)
    examples = make_examples(prepared.split.train, mask, prepared.special_token_ids, chat_row=chat_row_of(prepared))
    out = Path(args.out)
    module = GoldfishModule(
        initial_model(args.model, prepared, args.init_seed),
        examples,
        config,
        final_checkpoint=out / "checkpoints" / "final",
    )
    checkpoints = ModelCheckpoint(
        dirpath=out / "checkpoints",
        filename="{epoch}",
        every_n_epochs=args.save_every,
        save_top_k=-1,
        save_on_train_epoch_end=True,
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy=EngineTrainerStrategy(**parse_grid(args.grid)),
        max_epochs=args.epochs,
        accumulate_grad_batches=args.grad_accum,
        gradient_clip_val=args.max_grad_norm or None,
        gradient_clip_algorithm="norm",
        use_distributed_sampler=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[checkpoints],
    )
    trainer.fit(module, ckpt_path=args.resume)
    if trainer.is_global_zero:
        (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in module.records))
        consolidate_checkpoint(out / "checkpoints" / "final", out / "hf")


if __name__ == "__main__":
    main()
