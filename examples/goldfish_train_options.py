"""What the examples share with `goldfish train`: its own option groups (each flag means what it means there, with
the same defaults except a shorter --epochs) and the documents, mask and optimisation settings built from them.

The examples' loops honour only the training settings in TRAINING_FIELDS (the rest keep
engine.training.train.TrainConfig's defaults, as in `goldfish train` run without those flags)."""

from __future__ import annotations

import argparse
from dataclasses import asdict, replace
from typing import Callable

from engine.training.train import TrainConfig
from goldfish.app import options as opt
from goldfish.app.commands.option_values import data_of, mask_of
from goldfish.app.config import DataSpec, MaskSpec, TrainSpec
from goldfish.app.prepare import Prepared, prepare_data

TRAINING_FIELDS = ("epochs", "batch_size", "grad_accum", "lr", "max_grad_norm", "seed", "optimizer")
# --data (texts or conversations, docs/chat.md) and the selection
DATA_FIELDS = (
    "source",
    "text_field",
    "id_field",
    "chat_template",
    "n_train",
    "n_heldout",
    "seq_len",
    "seed",
    "vocab_size",
)
EPOCHS = 3


def add_goldfish_train_options(parser: argparse.ArgumentParser) -> None:
    """--model/--init-seed, the document selection, the mask and the honoured training flags of `goldfish train`."""
    defaults = TrainSpec()
    opt.MODEL.add_to(parser, defaults)
    opt.DATA.add_to(parser, defaults.data, skip=[f for f in asdict(defaults.data) if f not in DATA_FIELDS])
    opt.MASK.add_to(parser, MaskSpec())
    opt.TRAINING.add_to(
        parser,
        replace(defaults.train, epochs=EPOCHS),
        skip=[f for f in asdict(defaults.train) if f not in TRAINING_FIELDS],
    )


def train_config(args: argparse.Namespace) -> TrainConfig:
    """The TrainConfig of `goldfish train` with the same flags (0 for --max-grad-norm disables clipping)."""
    values = opt.TRAINING.values(args)
    values["max_grad_norm"] = values["max_grad_norm"] or None
    return replace(TrainConfig(), **values)


def documents_and_mask(args: argparse.Namespace, log: Callable[..., None] = print) -> tuple[Prepared, MaskSpec]:
    """The documents, tokenizer and mask `goldfish train` selects and builds from the same flags."""
    return prepare_data(data_of(args, DataSpec()), args.model, log=log), mask_of(args)
