"""The parsed option groups read back as the dataclasses they fill (goldfish.app.options: flag -> field)."""

from __future__ import annotations

import argparse
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any, Mapping

from goldfish.app import options as opt
from goldfish.app.config import DataSpec, Instruments, MaskSpec, Runtime, hierarchy_fields, mask_spec
from goldfish.app.lora import LoraSpec

if TYPE_CHECKING:  # the commands import torch, the engine and eval only when they run
    from engine import GridShape


def typed_fields(args: argparse.Namespace, group: opt.OptionGroup) -> dict[str, Any]:
    """{field: value} of the options of `group` the user typed (`args.typed`, goldfish.app.cli.parse_command_line):
    what goes over a preset, a model's defaults or a checkpoint's settings."""
    return {o.field: getattr(args, o.dest) for o in group.options if o.dest in args.typed}


def runtime_of(args: argparse.Namespace) -> Runtime:
    return Runtime(**opt.RUNTIME.values(args))


def data_of(args: argparse.Namespace, base: DataSpec | None = None) -> DataSpec:
    return replace(base or DataSpec(), **opt.DATA.values(args))


def mask_of(args: argparse.Namespace) -> MaskSpec:
    return mask_spec(**opt.MASK.values(args))


def train_config_of(args: argparse.Namespace, base: Any, shape: GridShape | None) -> Any:
    """The training options typed (`args.typed`) over `base` (the command's TrainConfig, with the model's defaults),
    as a validated TrainConfig; progress is --no-progress's. `shape`: the grid's sizes (None: one process)."""
    values = training_fields(typed_fields(args, opt.TRAINING), base, shape)
    return replace(base, **values, progress=runtime_of(args).progress)


def training_fields(values: Mapping[str, Any], base: Any, shape: GridShape | None) -> dict[str, Any]:
    """TRAINING option values (some or all) as the TrainConfig fields they set: --max-grad-norm 0 is None (no
    clipping); --zero-hierarchy sets the node size and the inner levels (an untyped int node size keeps `base`'s)."""
    fields = dict(values)
    if "max_grad_norm" in fields:
        fields["max_grad_norm"] = fields["max_grad_norm"] or None  # 0 disables clipping
    if "zero_node_size" in fields:
        fields["zero_node_size"], fields["zero_inner_levels"] = hierarchy_fields(
            fields["zero_node_size"], base.zero_inner_levels, shape
        )
    return fields


def lora_of(args: argparse.Namespace) -> LoraSpec:
    """The --lora-* options (checked against ZeRO by the spec, against the grid by check_on_grid)."""
    return LoraSpec(**opt.LORA.values(args))


def extraction_of(args: argparse.Namespace) -> Any:
    from eval.config import ExtractionConfig

    return ExtractionConfig(**opt.EXTRACTION.values(args))


def instruments_of(args: argparse.Namespace) -> Instruments:
    return Instruments(**opt.INSTRUMENTS.values(args))


def mask_defaults(spec: MaskSpec) -> dict[str, Any]:
    """A MaskSpec as option defaults: the standard loss (strategy None) is spelled "standard" on the command line."""
    return asdict(spec) | {"strategy": spec.strategy or "standard"}
