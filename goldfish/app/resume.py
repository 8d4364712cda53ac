"""`goldfish train --resume DIR`: continue a run with its checkpoint's own settings, and refuse any change that
shapes the experiment.

The checkpoint's run record (goldfish_run.json) holds the whole TrainSpec. A resume takes every option the user did
not type from it; an option typed with another value is a change. Changes that shape the experiment (the model,
the documents, the mask, the optimisation, LoRA: `shaping_differences`) are refused, all named in one line, before
anything is written. Settings of how the run is computed or kept may change (RESUMABLE_TRAINING: checkpoints,
validation interval, ZeRO, activation checkpointing, rows layout; and every runtime option: device, threads,
progress, grid, nproc, report-to).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from engine.training.train import TrainConfig
from goldfish.app import options as opt
from goldfish.app.config import DataSpec, MaskSpec, TrainSpec
from goldfish.app.experiment import RUN_FILE, background_train_config
from goldfish.app.lora import LoraSpec

# TrainConfig fields that change how a run is computed or kept, not what it computes: a resume may change them.
RESUMABLE_TRAINING = frozenset(
    {
        "progress",
        "save_every",
        "async_save",
        "eval_every",
        "zero",
        "zero_node_size",
        "zero_inner_levels",
        "offload_optimizer",
        "activation_checkpointing",
        "offload_activations",
        "compile",
        "rows",
        "pipe_schedule",
        "microbatches",
        "pipe_virtual",
        "pipe_split",
    }
)
# TrainConfig fields a resume never takes from the record: how this launch writes its checkpoints (an --async-save run
# may resume in one process, where there is nothing to write in the background).
NOT_INHERITED_TRAINING = frozenset({"async_save"})
# DataSpec fields of the same kind: tokenizing the background in more processes gives the same tokens.
RESUMABLE_DATA = frozenset({"tokenize_workers", "cache_dir"})

_GROUPS = (("model", opt.MODEL), ("data", opt.DATA), ("mask", opt.MASK), ("train", opt.TRAINING), ("lora", opt.LORA))


def read_run_record(checkpoint: Path) -> dict[str, Any]:
    """The run record of a checkpoint folder; ValueError, in one line, when the folder is not a goldfish run."""
    path = checkpoint / RUN_FILE
    if not path.is_file():
        inside = checkpoint / "checkpoint"
        hint = (
            f" (it holds a run: give --resume {inside})"
            if (inside / RUN_FILE).is_file()
            else " (give the checkpoint/ folder a goldfish train run wrote, e.g. --resume runs/a/checkpoint)"
        )
        raise ValueError(f"--resume {checkpoint} is not a goldfish run checkpoint: it has no {RUN_FILE}{hint}")
    try:
        record = json.loads(path.read_text())
        recorded_spec(record)
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
        raise ValueError(
            f"{path} cannot be read as a goldfish run record ({error}): the checkpoint is damaged or was written by "
            "another version. Fix: resume from an intact checkpoint, or start a new run"
        ) from None
    return record


def recorded_spec(record: dict[str, Any]) -> TrainSpec:
    """The TrainSpec a run record describes (its "train" is the config the run trained with)."""
    mask = {key: value for key, value in record["mask"].items() if key != "label"}
    return TrainSpec(
        model=record["model"],
        init_seed=record["init_seed"],
        data=DataSpec(**record["data"]),
        mask=MaskSpec(**mask),
        train=TrainConfig(**record["train"]),
        lora=LoraSpec(**record["lora"]) if record.get("lora") else LoraSpec(),
    )


def _as_option(group: str, field: str, value: Any) -> Any:
    """A spec field's value as its option holds it after parsing."""
    if group == "mask" and field == "strategy":
        return value or "standard"
    if group == "train" and field == "max_grad_norm":
        return value or 0.0  # None (no clipping) is typed as 0
    return value


def with_recorded_options(args: argparse.Namespace, saved: TrainSpec) -> argparse.Namespace:
    """`args` (a new namespace) with every option of the model, data, mask, training and LoRA groups the user did not
    type (`args.typed`) set to the value the checkpoint's run used."""
    parts = {"model": {"model": saved.model, "init_seed": saved.init_seed}} | {
        name: asdict(getattr(saved, name)) for name in ("data", "mask", "train", "lora")
    }
    recorded = {
        option.dest: _as_option(name, option.field, parts[name][option.field])
        for name, group in _GROUPS
        for option in group.options
        if option.field in parts[name] and not (name == "train" and option.field in NOT_INHERITED_TRAINING)
    }
    untyped = {dest: value for dest, value in recorded.items() if dest not in args.typed and hasattr(args, dest)}
    return argparse.Namespace(**(vars(args) | untyped))


def _flag(group: str, field: str) -> str:
    """The option that sets a field, or the field's name when no option does."""
    for name, options in _GROUPS:
        if name == group:
            for option in options.options:
                if option.field == field:
                    return option.flag
    return f"{group}.{field}"


def shaping_differences(saved: TrainSpec, new: TrainSpec) -> list[str]:
    """Every setting that shapes the experiment and differs between a checkpoint's run and `new`, as
    '--flag SAVED -> NEW'. A background run trains its stream in order: compare the configs it trains with."""
    train = background_train_config(new.train) if new.data.background is not None else new.train
    pairs = [("model", "model", saved.model, new.model), ("model", "init_seed", saved.init_seed, new.init_seed)]
    for group, before, after, free in (
        ("data", saved.data, new.data, RESUMABLE_DATA),
        ("mask", saved.mask, new.mask, frozenset()),
        ("train", saved.train, train, RESUMABLE_TRAINING),
        ("lora", saved.lora, new.lora, frozenset()),
    ):
        pairs += [
            (group, f.name, getattr(before, f.name), getattr(after, f.name))
            for f in fields(before)
            if f.name not in free
        ]
    return [f"{_flag(group, field)} {_show(old)} -> {_show(now)}" for group, field, old, now in pairs if old != now]


def _show(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return ",".join(map(str, value))
    return str(value)


def check_unchanged(checkpoint: Path, saved: TrainSpec, new: TrainSpec) -> None:
    """Refuse (ValueError, one line naming every difference) a resume whose settings shape another experiment."""
    changed = shaping_differences(saved, new)
    if changed:
        raise ValueError(
            f"--resume {checkpoint}: the checkpoint's run used other settings that shape the experiment ("
            + "; ".join(changed)
            + "). Fix: leave those options out (--resume alone continues with the checkpoint's own settings), or "
            "start a new run with another --out"
        )
