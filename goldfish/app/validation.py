"""One validation pass per command: every check that needs no loaded model or data, run before any work starts.

    validate_train                 goldfish train: a resume changes nothing that shapes the experiment; the settings
                                   against the grid (ZeRO, rows, pipeline, LoRA and peft, the model's config file, the
                                   checkpoint to resume); a local --data source read once before --nproc workers start
    validate_compare               goldfish compare: the hub reachable for the paper preset; the settings against the
                                   grid; the local documents (--nproc); the extraction protocol fits them
    validate_compare_checkpoints   compare --checkpoints: one process, the hub reachable
    validate_eval                  goldfish eval: --out free to write and to lock; a pipe grid's limits; the model's
                                   and the reference's config files and weights; a run record or --data; the local
                                   documents (--nproc)
    validate_mask                  goldfish mask: one text to mask, and a goldfish mask to show

Each is called once, by its command (goldfish.app.commands.<command>.cmd_*), after the command line is resolved
into its spec and before anything is written, loaded or launched: a bad setting is one line on stderr and exit 2
(goldfish.app.cli.main). A setting's own value is checked when its spec is built (the dataclasses' __post_init__ in
goldfish.app.config, engine.training.config and eval.config): building the spec is resolving it.

Under the --out lock, as the work starts: train and compare refuse a non-empty --out without --overwrite as they
make their run folder (goldfish.app.commands.run_folder), where no other run can fill it in between.

After loading: the checks that need the documents, the tokenizer or the model stay where those are loaded:
    - the documents are long enough for the extraction protocol (goldfish.app.checks.check_extraction_fits, in
      goldfish eval's run) and eval re-selects the documents its run record lists (commands.eval, same documents)
    - enough documents for --n-train and --n-heldout (data.check_document_count, goldfish.app.prepare), a chat
      template that renders (data.chat.check_chat_template, in prepare and goldfish mask)
    - the model's vocabulary holds the tokenizer's ids (goldfish.app.model_files.check_vocabulary)
    - a goldfish mask that drops targets of packed documents (goldfish.app.training_rows.check_mask_drops)
    - LoRA's target layers exist in the model (goldfish.app.lora.check_targets)
    - a hub model's config against the pipeline (downloaded by the workers, engine.check_pipeline_config)
    - goldfish mask: the --conversation record exists, --file is readable UTF-8 under the size limit, the text has
      two tokens
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from goldfish.app.checks import check_eval_out
from goldfish.app.commands.preflight import check_documents, check_on_grid
from goldfish.app.commands.processes import one_process
from goldfish.app.config import RUN_FILE, CompareSpec, EvalSpec, MaskSpec, Runtime, TrainSpec, check_extraction_window
from goldfish.app.resume import check_unchanged
from goldfish.app.runlock import check_out_free
from goldfish.strategies import STRATEGIES

if TYPE_CHECKING:  # the checks import torch, the engine and transformers only where they need them
    from engine import GridShape


def validate_train(
    spec: TrainSpec, runtime: Runtime, shape: GridShape | None, resume: Path | None, saved: TrainSpec | None
) -> None:
    """Every check of a `goldfish train` run before any work: with --resume (checkpoint folder `resume`, its run's
    spec `saved`), no typed option changes what shapes the experiment; the spec against the grid `shape` (None: one
    process) and the checkpoint; with --nproc, a local --data source readable before the workers start."""
    if resume is not None and saved is not None:
        check_unchanged(resume, saved, spec)
    check_on_grid(spec, shape or one_process(), resume)
    if runtime.nproc:
        check_documents(spec.data)


def validate_compare(spec: CompareSpec, runtime: Runtime, shape: GridShape | None, preset: str | None) -> None:
    """Every check of a `goldfish compare` run before any work: the hub reachable for the paper preset, the spec
    against the grid, the local documents (--nproc), an extraction protocol that fits them."""
    if preset == "paper":
        check_hub_sources(spec, {})
    check_on_grid(spec, shape or one_process(), None)
    if runtime.nproc:
        check_documents(spec.data)
    check_extraction_window(spec.data, spec.extraction, spec.instruments.prefix_lengths)


def validate_compare_checkpoints(spec: CompareSpec, runtime: Runtime, checkpoints: Mapping[str, str]) -> None:
    """Every check of `goldfish compare --checkpoints` before any work: one process, and the hub reachable for the
    documents and the checkpoints that are not local."""
    if runtime.nproc or runtime.grid or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError(
            "--checkpoints evaluates in one process (one device): leave out --nproc and --grid, and run it without "
            "torchrun"
        )
    check_hub_sources(spec, checkpoints)


def validate_eval(
    spec: EvalSpec, runtime: Runtime, shape: GridShape | None, out: Path, *, overwrite: bool, locks: bool
) -> None:
    """Every check of a `goldfish eval` run before any work: --out free to write (empty unless --overwrite) and, when
    this process is the one to lock it (`locks`), held by no other run; what a pipe grid cannot evaluate; the config
    files of the model and the reference, the model's weights readable; a run record or --data to choose the
    documents; a reference that names a model; the local documents (--nproc)."""
    from goldfish.app.model_config_check import check_config_file

    check_eval_out(out, overwrite=overwrite)
    if locks:
        check_out_free(out)
    if shape is not None and shape.pipe > 1:
        check_pipe_grid(spec, shape)
    for folder in (spec.model, spec.reference):
        check_config_file(folder)
    if Path(spec.model).is_dir():  # weights loading would refuse: one line before the run starts (and its threads)
        from goldfish.app.pretrained import check_weights_readable

        check_weights_readable(spec.model)
    eval_run_record(spec)  # a model without a run record needs --data
    check_reference(spec.reference)  # it is loaded after the whole extraction: checked before any
    if runtime.nproc and spec.data is not None:
        check_documents(spec.data)


def validate_mask(inputs: Mapping[str, str | None], mask: MaskSpec) -> None:
    """Every check of `goldfish mask` before any work: exactly one of `inputs` (--text, --file, --conversation by
    flag) given, and a goldfish mask (not the standard loss) to show."""
    if sum(value is not None for value in inputs.values()) != 1:
        raise ValueError("give exactly one of " + ", ".join(list(inputs)[:-1]) + f" or {list(inputs)[-1]}")
    if mask.strategy is None:
        raise ValueError("goldfish mask shows a goldfish mask: choose --strategy " + "|".join(STRATEGIES))


def check_pipe_grid(spec: EvalSpec, shape: GridShape) -> None:
    """Refuse (one line, before any work) what evaluation through pipeline stages cannot run: x, y or z beside pipe,
    and, for a model whose config is here, a model its stages cannot cut."""
    from eval.parallel import PIPE_GRID_REFUSAL

    if shape.size("x", "y", "z") > 1:
        raise ValueError(PIPE_GRID_REFUSAL)
    from engine import check_pipeline_config
    from goldfish.app.models import local_config

    config = local_config(str(spec.model), vocab_size=1 << 16, max_positions=2)  # family, layers and tying only
    if config is not None:
        check_pipeline_config(config, shape.pipe)


def check_hub_sources(spec: CompareSpec, checkpoints: Mapping[str, str]) -> None:
    """Refuse in one line, before anything is written, a run whose hub sources (documents, background, tokenizer,
    model or checkpoints that are not local) cannot be reached (goldfish.app.paper.check_hub)."""
    import data
    from data.corpus import PYTHON_DOCSTRINGS, PYTHON_STDLIB
    from goldfish.app.models import is_tiny_model
    from goldfish.app.paper import check_hub
    from goldfish.app.pretrained import resolve_gguf

    def remote(name: str | None) -> bool:
        return bool(name) and name not in (PYTHON_STDLIB, PYTHON_DOCSTRINGS) and not data.is_local_source(name)

    models = list(checkpoints.values()) or [spec.model]
    models = [m for m in models if not is_tiny_model(m) and resolve_gguf(m) is None]
    sources = [spec.data.source, spec.data.tokenizer, *models]
    if not checkpoints:
        sources.append(spec.data.background)  # evaluating checkpoints reads no background
    check_hub(list(dict.fromkeys(name for name in sources if remote(name))))


def eval_run_record(spec: EvalSpec) -> dict[str, Any] | None:
    """The run record of the checkpoint `goldfish eval` measures (None when --data chooses the documents), refused in
    one line when it is missing or unreadable."""
    import json

    record_path = Path(spec.model) / RUN_FILE
    if spec.data is not None:
        return None
    if not record_path.exists():
        raise ValueError(
            f"{spec.model} has no {RUN_FILE} (it was not written by goldfish train): give --data and the "
            "selection options to say which documents to evaluate"
        )
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(
            f"{record_path} is not a run record (not UTF-8 JSON: {error}); restore the file from the run, or give "
            "--data and the selection options to say which documents to evaluate"
        ) from None
    if not isinstance(record, dict):
        raise ValueError(f"{record_path} is not a run record (a JSON {type(record).__name__}, not an object)")
    return record


def check_reference(choice: str) -> None:
    """Refuse (one line) an eval --reference that names no model: a tiny model, a .gguf file or alias, or an HF
    folder or name whose config loads."""
    from goldfish.app.models import is_tiny_model
    from goldfish.app.pretrained import resolve_gguf

    if choice in ("auto", "none") or is_tiny_model(choice):
        return
    gguf = resolve_gguf(choice)
    if gguf is not None:
        if not gguf.is_file():
            raise ValueError(f"--reference {choice}: no such file. Fix: give an existing .gguf file, auto or none")
        return
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(choice, trust_remote_code=False)
    except (OSError, ValueError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(
            f"--reference {choice}: not a model folder or name ({reason}). Fix: give a model folder or HF name, "
            "auto (the initial weights of the run that trained --model) or none"
        ) from None
    if Path(choice).is_dir():  # weights it would refuse after the whole extraction: refused before it
        from goldfish.app.pretrained import check_weights_readable

        try:
            check_weights_readable(choice)
        except ValueError as error:
            raise ValueError(f"--reference {choice}: {error}") from None
