"""A goldfish training loop started by `accelerate launch`, its model parallelized by the engine.

    accelerate launch --multi_gpu --num_processes 4 --num_machines 1 --mixed_precision no --dynamo_backend no \
        examples/accelerate_goldfish.py --grid x=2,y=2 --out runs/accelerate

(`--multi_gpu` picks accelerate's torchrun launcher, on CPU-only machines too, where the engine then runs on
gloo; `--cpu` would start a single process.)

`accelerate launch` starts the processes with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT); `engine.init` reads it, so the script builds the grid, shards the model with
`engine.parallelize`, and then runs an ordinary loop: forward on this process's own sequences, goldfish
loss, backward, `engine.sync_gradients`, `engine.clip_grad_norm_`, AdamW. The model is not handed to
`Accelerator.prepare` (that would wrap it in DDP); the Accelerator is used for what it is good at here
(printing once, waiting for every process). Documents, model init, mask, batch order and optimizer are
`goldfish train`'s with the same options, so OUT/metrics.jsonl holds its loss per step (to float32
rounding); OUT/hf is the consolidated model (an ordinary HF folder).

Needs `pip install -e ".[hf]"` (accelerate).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from accelerate import Accelerator
from goldfish_train_options import (  # examples/goldfish_train_options.py
    add_goldfish_train_options,
    documents_and_mask,
    train_config,
)

import engine
import engine.training.train as engine_train
from data.batch import Batch
from engine.core import comm
from engine.core.grid import AXES
from goldfish import goldfish_loss
from goldfish.app.config import parse_grid
from goldfish.app.model_files import initial_model, save_parallel_hf_model
from goldfish.app.training_rows import chat_row_of, make_examples


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--grid", default="", help="engine grid, e.g. x=2,y=2 (data fills the rest of the world)")
    add_goldfish_train_options(p)
    return p.parse_args(argv)


def grid_from_launcher(text: str) -> engine.Grid:
    """The engine grid over the launcher's world; the data axis takes what x*y*z leaves."""
    import os

    sizes = parse_grid(text)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    tensor = sizes.get("x", 1) * sizes.get("y", 1) * sizes.get("z", 1)
    if "data" not in sizes:
        if world % tensor:
            raise SystemExit(
                f"--grid {text} needs a multiple of {tensor} processes, the launcher started {world}: "
                f"use --num_processes {tensor * max(1, world // tensor)} or another grid"
            )
        sizes["data"] = world // tensor
    return engine.init(**sizes)  # RANK / WORLD_SIZE / MASTER_* from accelerate launch (torchrun's environment)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    grid = grid_from_launcher(args.grid)
    accelerator = Accelerator(cpu=grid.device.type == "cpu")  # joins the process group engine.init started
    config = train_config(args)
    if config.batch_size % (grid.world_size * config.grad_accum):
        raise SystemExit(
            f"--batch-size {config.batch_size} must be a multiple of processes x grad-accum = "
            f"{grid.world_size * config.grad_accum}"
        )

    prepared, mask = documents_and_mask(args, log=accelerator.print)
    examples = make_examples(prepared.split.train, mask, prepared.special_token_ids, chat_row=chat_row_of(prepared))
    model = engine.parallelize(initial_model(args.model, prepared, args.init_seed).to(grid.device), grid)
    optimizer = engine_train.make_optimizer(model, config)  # after parallelize: over the shards
    per_epoch = engine_train.steps_per_epoch(len(examples), config.batch_size)
    total_steps = config.epochs * per_epoch
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: engine_train.lr_factor(s, total_steps, config))

    out = Path(args.out)
    records = []
    model.train()
    for step in range(total_steps):
        epoch, index = divmod(step, per_epoch)
        rows = engine_train.epoch_order(len(examples), config.seed, epoch)[
            index * config.batch_size : (index + 1) * config.batch_size
        ]
        share = len(rows) // grid.world_size
        rows = rows[grid.rank * share : (grid.rank + 1) * share]  # this process's own sequences
        sums = torch.zeros(6, dtype=torch.float64)  # kept CE, kept n, all CE, all n, dropped CE, dropped n
        for micro in torch.tensor_split(rows, config.grad_accum):
            batch = Batch.stack(examples, micro, step, grid.device)
            result = goldfish_loss(model(input_ids=batch.input_ids).logits, batch.targets, batch.dropped)
            result.loss_sum.backward()  # summed here, divided by the step's kept-target count below
            sums += torch.tensor(
                [
                    float(result.loss_sum.detach()),
                    result.n_kept,
                    float(result.all_loss) * result.n_all,
                    result.n_all,
                    float(result.dropped_loss) * result.n_dropped if result.n_dropped else 0.0,
                    result.n_dropped,
                ],
                dtype=torch.float64,
            )
        sums = comm.sum_control(sums, grid.group(*AXES))  # the step's sums over every process
        engine.sync_gradients(model, grid)  # every gradient = gradient of the SUM of all processes' losses
        for param in model.parameters():
            if param.grad is not None:
                param.grad.div_(float(sums[1]))  # -> gradient of the mean over the step's kept targets
        max_norm = config.max_grad_norm if config.max_grad_norm is not None else float("inf")
        grad_norm = engine.clip_grad_norm_(model, max_norm, grid)
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        records.append(
            {
                "step": step + 1,
                "loss": float(sums[0] / sums[1]),
                "all_loss": float(sums[2] / sums[3]),
                "dropped_loss": float(sums[4] / sums[5]) if sums[5] else None,
                "lr": lr,
                "grad_norm": float(grad_norm),
            }
        )
        accelerator.print(f"step {step + 1}/{total_steps} loss {records[-1]['loss']:.4f}")

    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        (out / "hf").mkdir(exist_ok=True)
    accelerator.wait_for_everyone()
    # collective: every process gathers its shards; the main process writes an ordinary HF folder
    save_parallel_hf_model(model, grid, prepared.tokenizer, {"example": "accelerate_goldfish"}, out / "hf")
    accelerator.wait_for_everyone()
    grid.close(destroy_world=True)  # gloo aborts at exit when a live process group outlives Python


if __name__ == "__main__":
    main()
