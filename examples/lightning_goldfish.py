"""Train with the goldfish loss in a Lightning Fabric loop on the engine's 4-D grid.

    torchrun --standalone --nproc-per-node 4 examples/lightning_goldfish.py --grid x=2,y=2 --out runs/fabric
    python examples/lightning_goldfish.py --devices 2 --grid x=2 --out runs/fabric     # Fabric starts the processes

Same documents, model init, mask, data order, optimizer and schedule as `goldfish train` with the same options,
so OUT/metrics.jsonl holds the same loss per step as `goldfish train`'s (to float32 rounding). Checkpoints go
to OUT/checkpoints/step-N (engine checkpoints written by fabric.save; --resume continues exactly), and the
last one is consolidated into OUT/hf, an ordinary HF folder (weights, config, tokenizer).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from goldfish_train_options import (  # examples/goldfish_train_options.py
    add_goldfish_train_options,
    documents_and_mask,
    train_config,
)
from lightning.fabric import Fabric

import engine.training.train as engine_train
from engine.integrations.lightning import EngineStrategy, consolidate_checkpoint
from goldfish import IGNORE_INDEX, goldfish_loss
from goldfish.app.config import parse_grid
from goldfish.app.model_files import initial_model
from goldfish.app.training_rows import chat_row_of, make_examples


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--grid", default="", help="engine grid, e.g. x=2,y=2 (data fills the rest of the world)")
    p.add_argument(
        "--devices",
        type=int,
        default=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        help="processes per node (under torchrun: its --nproc-per-node)",
    )
    add_goldfish_train_options(p)
    p.add_argument("--save-every", type=int, default=0, help="checkpoint every N steps (and at the end)")
    p.add_argument("--resume", default=None, help="an OUT/checkpoints/step-N folder of a run with the same options")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    config = train_config(args)
    fabric = Fabric(accelerator="cpu", devices=args.devices, strategy=EngineStrategy(**parse_grid(args.grid)))
    fabric.launch()
    out = Path(args.out)

    # The documents, tokenizer, initial weights and masks of `goldfish train` with the same options.
    prepared, mask = documents_and_mask(args, log=fabric.print)
    examples = make_examples(prepared.split.train, mask, prepared.special_token_ids, chat_row=chat_row_of(prepared))
    model = initial_model(args.model, prepared, args.init_seed)

    # The engine replaces Linear layers by their shards: build the optimizer from the parallel model.
    model = fabric.setup_module(model)
    optimizer = fabric.setup_optimizers(engine_train.make_optimizer(model, config))
    per_epoch = engine_train.steps_per_epoch(len(examples), config.batch_size)
    total_steps = config.epochs * per_epoch
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: engine_train.lr_factor(s, total_steps, config))
    state = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "step": 0}
    if args.resume:
        fabric.load(args.resume, state)
    world, rank = fabric.world_size, fabric.global_rank
    if config.batch_size % (world * config.grad_accum):
        raise SystemExit(
            f"--batch-size {config.batch_size} must be a multiple of processes x grad-accum = "
            f"{world * config.grad_accum}"
        )

    metrics_path = out / "metrics.jsonl"
    if fabric.is_global_zero:
        out.mkdir(parents=True, exist_ok=True)
        kept = (
            []
            if not metrics_path.exists()
            else [line for line in metrics_path.read_text().splitlines() if json.loads(line)["step"] <= state["step"]]
        )
        metrics_path.write_text("".join(line + "\n" for line in kept))
    model.train()
    for step in range(state["step"], total_steps):
        epoch, index = divmod(step, per_epoch)
        rows = engine_train.epoch_order(len(examples), config.seed, epoch)[
            index * config.batch_size : (index + 1) * config.batch_size
        ]
        share = len(rows) // world
        rows = rows[rank * share : (rank + 1) * share]  # this process's own sequences of the step
        micro_batches = torch.tensor_split(rows, config.grad_accum)
        batches = [
            {
                key: torch.stack([getattr(examples[i], key) for i in micro.tolist()])
                for key in ("input_ids", "targets", "dropped")
            }
            for micro in micro_batches
        ]
        # The step's mean is over every kept target of every process: count them first (no gradient involved).
        counts = torch.tensor([float((~b["dropped"] & (b["targets"] != IGNORE_INDEX)).sum()) for b in batches]).sum()
        n_kept = float(fabric.all_reduce(counts, reduce_op="sum"))
        sums = torch.zeros(5, dtype=torch.float64)
        for i, batch in enumerate(batches):
            with fabric.no_backward_sync(model, enabled=i < len(batches) - 1):  # sync once per step
                logits = model(input_ids=batch["input_ids"]).logits  # (B, T, V)
                result = goldfish_loss(logits, batch["targets"], batch["dropped"])
                # gradients are averaged over processes (as DDP does): scale so the mean is the global token mean
                fabric.backward(result.loss_sum * world / n_kept)
            sums += torch.tensor(
                [
                    float(result.loss_sum.detach()),
                    float(result.all_loss) * result.n_all,
                    result.n_all,
                    float(result.dropped_loss) * result.n_dropped if result.n_dropped else 0.0,
                    result.n_dropped,
                ],
                dtype=torch.float64,
            )
        sums = fabric.all_reduce(sums, reduce_op="sum")
        max_norm = config.max_grad_norm if config.max_grad_norm is not None else float("inf")
        grad_norm = fabric.clip_gradients(model, optimizer, max_norm=max_norm)
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        state["step"] = step + 1
        record = {
            "step": step + 1,
            "loss": float(sums[0]) / n_kept,
            "all_loss": float(sums[1] / sums[2]),
            "dropped_loss": float(sums[3] / sums[4]) if sums[4] else None,
            "lr": lr,
            "grad_norm": float(grad_norm),
        }
        if fabric.is_global_zero:
            with metrics_path.open("a") as handle:
                handle.write(json.dumps(record) + "\n")
        fabric.print(f"step {step + 1}/{total_steps} loss {record['loss']:.4f}")
        if state["step"] == total_steps or (args.save_every and state["step"] % args.save_every == 0):
            fabric.save(out / "checkpoints" / f"step-{state['step']}", state)

    if fabric.is_global_zero:  # one process: an ordinary HF folder from the last checkpoint
        hf = consolidate_checkpoint(out / "checkpoints" / f"step-{total_steps}", out / "hf")
        prepared.tokenizer.save_pretrained(hf)
    fabric.barrier()


if __name__ == "__main__":
    main()
