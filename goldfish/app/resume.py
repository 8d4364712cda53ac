"""`goldfish train --resume DIR`: continue a run with its checkpoint's own settings, and refuse any change that
shapes the experiment.

The checkpoint's run record (goldfish_run.json) holds the whole TrainSpec. A resume is that spec with the options
the user typed put in with dataclasses.replace (`resumed_spec`); an option typed with another value is a change.
Changes that shape the experiment (the model, the documents, the mask, the optimisation, LoRA:
`shaping_differences`) are refused, all named in one line, before anything is written. Settings of how the run is
computed or kept may change (RESUMABLE_TRAINING: checkpoints, validation interval, ZeRO, activation checkpointing,
rows layout; and every runtime option: device, threads, progress, grid, nproc, report-to).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from engine import TrainConfig
from goldfish.app import options as opt
from goldfish.app.commands.option_values import runtime_of, training_fields, typed_fields
from goldfish.app.config import RUN_FILE, DataSpec, MaskSpec, TrainSpec, background_train_config, mask_spec
from goldfish.app.lora import LoraSpec

if TYPE_CHECKING:
    from engine import GridShape

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


def resume_folder(resume: str | None) -> Path | None:
    """The --resume folder (None without --resume), refused in one line when it does not exist, before anything else
    runs; a checkpoint that a run killed while replacing it had set aside is put back first."""
    if resume is None:
        return None
    from data.atomic import recover_directory

    path = Path(resume)
    if recover_directory(path):  # a run killed while it replaced its checkpoint: the previous one is complete
        print(f"recovered {path} from the complete previous checkpoint a killed run had set aside", file=sys.stderr)
    if not path.is_dir():
        raise ValueError(
            f"--resume {resume}: no such folder. Fix: give the checkpoint/ folder of an interrupted run "
            "(e.g. --resume runs/a/checkpoint), or leave --resume out to start a new run"
        )
    return path


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
    return TrainSpec(
        model=record["model"],
        init_seed=record["init_seed"],
        data=recorded_data(record),
        mask=recorded_mask(record),
        train=TrainConfig(**record["train"]),
        lora=LoraSpec(**record["lora"]) if record.get("lora") else LoraSpec(),
    )


# What a record written before a data setting existed selected its documents with (`goldfish eval` and
# `goldfish train --resume` read such a record alike): deduplication came later, and such a run had none.
EARLIER_DATA = MappingProxyType({"dedup": "off"})


def recorded_data(record: dict[str, Any]) -> DataSpec:
    """The DataSpec a run record describes, a record of an earlier version included (EARLIER_DATA)."""
    return DataSpec(**(EARLIER_DATA | record["data"]))


def recorded_mask(record: dict[str, Any]) -> MaskSpec:
    """The MaskSpec a run record describes (its "label" is derived, not a field)."""
    return MaskSpec(**{key: value for key, value in record["mask"].items() if key != "label"})


def resumed_spec(saved: TrainSpec, args: argparse.Namespace, shape: GridShape | None) -> TrainSpec:
    """The checkpoint's spec `saved` with the options the user typed (`args.typed`) in place, by dataclasses.replace:
    every setting not typed is the checkpoint's own, except how this launch runs (progress, from --no-progress) and
    writes (NOT_INHERITED_TRAINING: this command line's value). Checked by `check_unchanged`, not here."""

    def typed(group: opt.OptionGroup) -> dict[str, Any]:
        return typed_fields(args, group)

    mask = asdict(saved.mask) | {"strategy": saved.mask.strategy or "standard"}  # as mask_spec takes it
    own = {name: getattr(args, name) for name in NOT_INHERITED_TRAINING}
    train = training_fields(typed(opt.TRAINING), saved.train, shape) | own
    return replace(
        saved,
        **typed(opt.MODEL),
        data=replace(saved.data, **typed(opt.DATA)),
        mask=mask_spec(**(mask | typed(opt.MASK))),
        train=replace(saved.train, **train, progress=runtime_of(args).progress),
        lora=replace(saved.lora, **typed(opt.LORA)),
    )


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
