"""What every rank of a train or compare run would refuse, checked once by the launcher before any worker starts
(in the command's validation pass, goldfish.app.validation)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from goldfish.app.config import CompareSpec, DataSpec, TrainSpec, background_train_config

if TYPE_CHECKING:  # the commands import torch, the engine and eval only when they run
    from engine import GridShape


def check_documents(spec: DataSpec) -> None:
    """Read a local --data source once before worker processes start, so a missing file or a malformed record is
    one line from the launcher (a dataset from the hub is left to the workers: it needs the network)."""
    import data

    if spec.source is not None and data.is_local_source(spec.source):
        documents = data.load_documents(
            spec.source, text_field=spec.text_field, id_field=spec.id_field, split=spec.split
        )
        data.check_document_count(len(documents), spec.n_train, spec.n_heldout)


def check_on_grid(spec: TrainSpec | CompareSpec, shape: GridShape, resume: Path | None) -> None:
    """What every rank of a run would refuse in its settings against the grid, checked once before any starts: ZeRO
    against the grid, a step's rows against the rows layout, LoRA on a data-parallel grid only (and peft installed),
    and the settings of the run to resume (as the workers train: a background run reads its stream in order)."""
    from goldfish.app.model_config_check import check_config_file

    if spec.lora.enabled:  # before the data and the model are loaded (a resumed LoRA run included)
        from goldfish.app.lora import check_peft

        check_peft()
    check_config_file(spec.model)  # a hostile config.json: one line here, not a traceback in every worker
    train = background_train_config(spec.train) if spec.data.background is not None else spec.train
    layout = train.layout(shape)  # ZeRO, rows layout and precision against the grid
    layout.check_step_rows(train.batch_size)  # every full step; a short last step is checked by workers
    if shape.pipe > 1:
        _check_pipeline(spec, train, shape)
    if spec.lora.enabled:
        from goldfish.app.lora import check_grid

        check_grid({"x": shape.x, "y": shape.y, "z": shape.z})
    if resume is not None:
        from engine import check_resume

        check_resume(resume, train)


def _check_pipeline(spec: TrainSpec | CompareSpec, train: Any, shape: GridShape) -> None:
    """The settings a pipelined run refuses (engine.spec, engine/models/stages.py), before any worker starts:
    micro-batch counts the schedule or the batch cannot take, zero bubble with ZeRO 3 or activation checkpointing,
    and, for a model whose config is here, what its stages cannot run."""
    train.check_pipeline(shape)
    from engine import check_pipeline_config
    from goldfish.app.models import local_config

    # only the family, the layers and the tying are read: a vocabulary holding the architectures' default special
    # ids (GPT-2's 50256) keeps the config from warning about them
    config = local_config(spec.model, vocab_size=1 << 16, max_positions=spec.data.seq_len or 2)
    if config is not None:  # a hub model's config is checked by the workers, which may download it
        check_pipeline_config(config, shape.pipe * train.pipe_virtual, train.pipe_split)
