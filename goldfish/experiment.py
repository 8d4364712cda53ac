"""Experiment wiring: documents -> masked examples -> training -> extraction, for `goldfish train|eval|compare`.

The only layer that imports every package (data, goldfish masks, engine, eval).
"""

from __future__ import annotations

import copy
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

import data
import engine.train as engine_train
from eval.adaptive import probabilistic_extract
from eval.divergence import divergence_row, divergence_summary, suffix_dropped_flags
from eval.extraction import ExtractionConfig, extract, write_extraction
from eval.membership import membership_rows, membership_summary
from goldfish.loss import goldfish_loss
from goldfish.masks import STRATEGIES, causal_targets, drop_mask
from goldfish.models import build_tiny_model, is_tiny_model, load_pretrained_model
from goldfish.pretrained import load_gguf_tokenizer, load_pretrained, resolve_gguf

RUN_FILE = "goldfish_run.json"


@dataclass
class DataSpec:
    """Which documents, how many, how long. The same spec and seed always select the same documents."""

    source: str = data.DEFAULT_CORPUS
    text_field: str = "text"
    id_field: str | None = None
    split: str = "train"
    n_train: int = 32
    n_heldout: int = 32
    seq_len: int = 128
    seed: int = 0
    tokenizer: str | None = None  # HF name/folder; None: the model's own, or a BPE trained on the corpus
    vocab_size: int = 2048  # for the BPE trained for tiny models

    def __post_init__(self) -> None:
        if self.vocab_size < 300:
            raise ValueError(f"vocab_size must be >= 300 (256 bytes plus merges and special tokens), got {self.vocab_size}")


@dataclass(frozen=True)
class MaskSpec:
    """A goldfish mask; strategy None is the standard (unmasked) loss."""

    strategy: str | None = "hashed"
    k: int = 4
    h: int = 13
    seed: int = 0

    def __post_init__(self) -> None:
        if self.strategy is not None and self.strategy not in STRATEGIES:
            raise ValueError(f"unknown mask strategy {self.strategy!r}; choose one of {list(STRATEGIES)}")
        if self.strategy is not None and (not isinstance(self.k, int) or self.k < 2):
            raise ValueError(f"k must be an integer >= 2 (drop 1 in k tokens), got {self.k!r}")
        if not isinstance(self.h, int) or self.h < 1:
            raise ValueError(f"h (hash context width) must be an integer >= 1, got {self.h!r}")

    @property
    def label(self) -> str:
        if self.strategy is None:
            return "standard"
        window = f"-h{self.h}" if self.strategy.startswith("hashed") else ""
        return f"goldfish-{self.strategy}-k{self.k}{window}"

    def dropped(self, targets: torch.Tensor, special_token_ids: Sequence[int]) -> torch.Tensor:
        """(B, T) targets -> (B, T) bool, True where the target is dropped from the loss."""
        if self.strategy is None:
            return torch.zeros_like(targets, dtype=torch.bool)
        return drop_mask(targets, self.strategy, self.k, self.h, special_token_ids=special_token_ids, seed=self.seed)


def parse_mask(text: str) -> MaskSpec:
    """Parse 'standard', 'hashed:4', 'hashed:4:13', 'static:3', 'random:4' into a MaskSpec."""
    if text == "standard":
        return MaskSpec(strategy=None)
    parts = text.split(":")
    try:
        strategy = parts[0]
        k = int(parts[1]) if len(parts) > 1 else 4
        h = int(parts[2]) if len(parts) > 2 else 13
    except ValueError:
        raise ValueError(f"cannot parse mask {text!r}: use STRATEGY[:K[:H]], e.g. hashed:4:13 or static:3") from None
    if len(parts) > 3:
        raise ValueError(f"cannot parse mask {text!r}: use STRATEGY[:K[:H]], e.g. hashed:4:13")
    return MaskSpec(strategy=strategy, k=k, h=h)


GRID_AXES = ("data", "x", "y", "z")


def parse_grid(text: str) -> dict[str, int]:
    """Parse 'data=2,x=2,y=1,z=1' (any subset of the axes; missing axes are 1) into {axis: size}."""
    sizes: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        if name not in GRID_AXES or not value.isdigit() or int(value) < 1:
            raise ValueError(f"cannot parse grid {text!r}: use AXIS=SIZE pairs with axes {GRID_AXES} and sizes >= 1, "
                             "e.g. data=2,x=2")
        if name in sizes:
            raise ValueError(f"grid {text!r} names axis {name!r} twice")
        sizes[name] = int(value)
    return sizes


def start_grid(text: str | None) -> Any:
    """The engine grid of a parallel run (under torchrun), or None for a single process.

    With no --grid under torchrun, every rank is a data-parallel replica (data = world size).
    """
    import os

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if text is None and world == 1:
        return None
    import engine

    sizes = parse_grid(text) if text else {"data": world}
    return engine.init(**sizes)


def is_main_process(grid: Any) -> bool:
    return grid is None or grid.rank == 0


@dataclass
class Prepared:
    """Everything a run needs that comes from the data: tokenizer and the selected documents."""

    tokenizer: Any
    split: data.DocumentSplit
    n_loaded: int

    @property
    def special_token_ids(self) -> list[int]:
        return sorted(set(self.tokenizer.all_special_ids))


def prepare_data(spec: DataSpec, model_name: str, log=print) -> Prepared:
    """Load the documents, get a tokenizer and select the training and held-out documents."""
    documents = data.load_documents(spec.source, text_field=spec.text_field, id_field=spec.id_field, split=spec.split)
    if spec.tokenizer is not None:
        tokenizer = data.load_tokenizer(spec.tokenizer)
    elif is_tiny_model(model_name):
        tokenizer = data.train_bpe_tokenizer((d.text for d in documents), vocab_size=spec.vocab_size)
    elif resolve_gguf(model_name) is not None:  # smollm2-135m or a .gguf file: the tokenizer inside the file
        tokenizer = load_gguf_tokenizer(resolve_gguf(model_name))
    else:
        tokenizer = data.load_tokenizer(model_name)
    split = data.select_documents(documents, tokenizer, n_train=spec.n_train, n_heldout=spec.n_heldout,
                                  seq_len=spec.seq_len, seed=spec.seed)
    log(f"data: {len(documents)} documents from {spec.source!r}; {len(split.train)} train, {len(split.heldout)} "
        f"held-out of {spec.seq_len} tokens; {len(split.too_short)} skipped as shorter than {spec.seq_len} tokens")
    return Prepared(tokenizer=tokenizer, split=split, n_loaded=len(documents))


def initial_model(model_name: str, prepared: Prepared, seed: int) -> nn.Module:
    """The starting weights: a named tiny model at random init (seeded) or a pretrained HF model."""
    tokenizer = prepared.tokenizer
    if is_tiny_model(model_name):
        return build_tiny_model(model_name, vocab_size=len(tokenizer), max_positions=max(prepared.split.seq_len, 64),
                                seed=seed, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                pad_token_id=tokenizer.pad_token_id)
    if resolve_gguf(model_name) is not None:
        # Exported once to an ordinary HF folder in the user cache: later runs load in about a second.
        model, _ = load_pretrained(model_name, cache_dir=Path.home() / ".cache" / "goldfish" / "models")
    else:
        model = load_pretrained_model(model_name)
    if model.get_input_embeddings().num_embeddings < len(tokenizer):
        raise ValueError(f"tokenizer has {len(tokenizer)} tokens but model {model_name!r} embeds only "
                         f"{model.get_input_embeddings().num_embeddings}: use the model's own tokenizer")
    return model


def make_examples(documents: Sequence[data.TokenizedDocument], mask: MaskSpec,
                  special_token_ids: Sequence[int]) -> list[dict[str, torch.Tensor]]:
    """One training example per document: input ids, next-token targets and the goldfish drop mask, all (T,).

    For the `random` strategy the stored mask is only the first epoch's draw (for counting); the loss redraws it
    every step, since a per-occurrence Bernoulli mask must differ each time a sequence is seen.
    """
    examples = []
    for index, document in enumerate(documents):
        input_ids = torch.tensor(document.token_ids, dtype=torch.long)
        targets = causal_targets(input_ids.unsqueeze(0))
        dropped = mask.dropped(targets, special_token_ids) if mask.strategy != "random" else \
            _random_draw(mask, targets, special_token_ids, step=0, example_index=index)
        examples.append({"input_ids": input_ids, "targets": targets[0], "dropped": dropped[0]})
    return examples


def _random_draw(mask: MaskSpec, targets: torch.Tensor, special_token_ids: Sequence[int], *, step: int,
                 example_index: int) -> torch.Tensor:
    """A fresh Bernoulli(1/k) mask for one (1, T) row, seeded by (mask seed, step, example): reproducible on resume,
    different on every occurrence of the sequence, and independent of which rank holds the row."""
    seed = (mask.seed * 1_000_003 + step) * 1_000_003 + example_index
    return drop_mask(targets, "random", mask.k, mask.h, special_token_ids=special_token_ids, seed=seed)


def make_step_loss(mask: MaskSpec, special_token_ids: Sequence[int]) -> engine_train.LossFn:
    """The engine's loss hook: goldfish loss on kept targets, plus all-token and dropped-token losses for logging."""

    def step_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> engine_train.StepLoss:
        dropped = batch["dropped"]
        if mask.strategy == "random":
            step = int(batch["step"])
            dropped = torch.cat([
                _random_draw(mask, batch["targets"][row:row + 1].cpu(), special_token_ids, step=step,
                             example_index=int(index))
                for row, index in enumerate(batch["example_index"])]).to(dropped.device)
        logits = model(input_ids=batch["input_ids"]).logits  # (B, T, V)
        result = goldfish_loss(logits, batch["targets"], dropped)
        extras = {"all_loss": (float(result.all_loss) * result.n_all, result.n_all),
                  "dropped_loss": (float(result.dropped_loss) * result.n_dropped if result.n_dropped else 0.0,
                                   result.n_dropped)}
        return engine_train.StepLoss(loss_sum=result.loss_sum, n_tokens=result.n_kept, extras=extras)

    return step_loss


def save_hf_model(model: nn.Module, tokenizer: Any, run_record: dict[str, Any], directory: Path) -> None:
    """An ordinary HF checkpoint: weights (safetensors), config, tokenizer, and the run that produced it."""
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    (directory / RUN_FILE).write_text(json.dumps(run_record, indent=2))


def save_parallel_hf_model(model: nn.Module, grid: Any, tokenizer: Any, run_record: dict[str, Any],
                           directory: Path) -> None:
    """Consolidate a parallel model into an ordinary HF checkpoint. Called on every rank (the gather is collective);
    rank 0 writes the files."""
    import engine
    from transformers import AutoModelForCausalLM

    state = engine.full_state_dict(model, grid, rank0_only=True)
    if grid.rank != 0:
        return
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(model.config)
    plain.load_state_dict(state, assign=True)
    plain.tie_weights()
    save_hf_model(plain, tokenizer, run_record, directory)


def load_model_weights(model: nn.Module, directory: Path) -> None:
    """Load a checkpoint folder's weights into an already built model (for resume)."""
    loaded = load_pretrained_model(directory)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if missing or unexpected:
        raise ValueError(f"checkpoint {directory} does not match the model: missing {missing}, unexpected {unexpected}")


@dataclass
class TrainSpec:
    model: str = "tiny-llama"
    data: DataSpec = field(default_factory=DataSpec)
    mask: MaskSpec = field(default_factory=MaskSpec)
    train: engine_train.TrainConfig = field(default_factory=engine_train.TrainConfig)
    init_seed: int = 0


def run_record(spec: TrainSpec, prepared: Prepared) -> dict[str, Any]:
    record = {
        "model": spec.model,
        "init_seed": spec.init_seed,
        "data": asdict(spec.data),
        "mask": asdict(spec.mask) | {"label": spec.mask.label},
        "train": asdict(spec.train),
        "documents": prepared.split.manifest(),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
    }
    return record


def train_model(spec: TrainSpec, out_dir: Path, *, prepared: Prepared | None = None, model: nn.Module | None = None,
                resume_from: Path | None = None, grid: Any = None, log=print) -> tuple[nn.Module, Prepared]:
    """Train one model and write OUT/checkpoint (an HF checkpoint + tokenizer + trainer state) and OUT/metrics.jsonl."""
    prepared = prepared or prepare_data(spec.data, spec.model, log=log)
    model = model if model is not None else initial_model(spec.model, prepared, spec.init_seed)
    if resume_from is not None:
        load_model_weights(model, resume_from)  # full weights: valid at any grid, sharded below
    examples = make_examples(prepared.split.train, spec.mask, prepared.special_token_ids)
    n_dropped = sum(int(e["dropped"].sum()) for e in examples)
    n_targets = sum(int((e["targets"] != -100).sum()) for e in examples)
    log(f"train {spec.mask.label}: {len(examples)} sequences, {n_dropped}/{n_targets} targets dropped "
        f"({n_dropped / max(n_targets, 1):.3f}), {spec.train.epochs} epochs"
        + (f", grid {grid.shape}" if grid is not None else ""))
    record = run_record(spec, prepared)
    if grid is not None:
        import engine

        record["grid"] = {axis: getattr(grid.shape, axis) for axis in GRID_AXES}
        model = engine.parallelize(model.to(grid.device), grid)
        save = lambda m, d: save_parallel_hf_model(m, grid, prepared.tokenizer, record, d)  # noqa: E731
    else:
        save = lambda m, d: save_hf_model(m, prepared.tokenizer, record, d)  # noqa: E731
    if is_main_process(grid):
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "run.json").write_text(json.dumps(record, indent=2))
    engine_train.train(model, examples, make_step_loss(spec.mask, prepared.special_token_ids), spec.train,
                       out_dir=out_dir, grid=grid, resume_from=resume_from, save_model=save)
    return model, prepared


def evaluate_model(model: nn.Module, prepared: Prepared, documents: Sequence[data.TokenizedDocument],
                   extraction: ExtractionConfig, out_dir: Path | None, mask: MaskSpec | None = None,
                   progress: bool = True, *, instruments: bool = False) -> dict[str, Any]:
    """Greedy extraction on `documents`; writes OUT/extraction.jsonl and OUT/summary.json when out_dir is given.

    instruments: also the divergence analysis (where the greedy text first leaves the true suffix, and how often that
    is a position `mask` drops) and probabilistic extraction (exact probability that sampling at temperature 1
    emits the true suffix), added to the summary under "divergence" and "probabilistic".
    """
    tokenizer = prepared.tokenizer
    special = prepared.special_token_ids
    mask_fn = None
    if mask is not None and mask.strategy is not None:
        mask_fn = lambda targets: mask.dropped(targets, special)  # noqa: E731
    pad_id = pad_token_id(tokenizer)
    rows, summary = extract(model, documents, extraction, decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
                            pad_token_id=pad_id, drop_mask_fn=mask_fn, progress=progress)
    if instruments:
        summary["divergence"] = _divergence(rows, documents, extraction, mask_fn)
        _, summary["probabilistic"] = probabilistic_extract(model, documents, extraction, pad_token_id=pad_id)
    if out_dir is not None:
        write_extraction(rows, summary, out_dir)
    return summary


def pad_token_id(tokenizer: Any) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def _divergence(rows: list[dict[str, Any]], documents: Sequence[data.TokenizedDocument],
                extraction: ExtractionConfig, mask_fn: Any) -> dict[str, Any]:
    by_id = {d.id: d for d in documents}
    divergence_rows = []
    for row in rows:
        ids = by_id[row["id"]].token_ids
        prefix_len, suffix_len = row["n_prefix_tokens"], extraction.suffix_len
        flags = None
        if mask_fn is not None:
            dropped = mask_fn(causal_targets(torch.tensor([ids])))[0]
            flags = suffix_dropped_flags(dropped, prefix_len, suffix_len)
        divergence_rows.append(divergence_row(row["generated_ids"], ids[prefix_len:prefix_len + suffix_len], flags))
    return divergence_summary(divergence_rows)


def membership(model: nn.Module, prepared: Prepared, reference: nn.Module | None) -> dict[str, Any]:
    """Membership inference (loss, zlib, Min-K%, and reference-model ratio when `reference` is given): members are
    the training documents, non-members the held-out ones; AUC and TPR at 1% and 0.1% FPR."""
    tokenizer = prepared.tokenizer
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    pad_id = pad_token_id(tokenizer)
    members = membership_rows(model, prepared.split.train, decode=decode, pad_token_id=pad_id,
                              reference_model=reference, member=True)
    nonmembers = membership_rows(model, prepared.split.heldout, decode=decode, pad_token_id=pad_id,
                                 reference_model=reference, member=False)
    return membership_summary(members, nonmembers, min_k=0.2)


@dataclass
class CompareSpec:
    model: str = "tiny-llama"
    data: DataSpec = field(default_factory=DataSpec)
    masks: list[MaskSpec] = field(default_factory=lambda: [MaskSpec("hashed", 4, 13)])
    train: engine_train.TrainConfig = field(default_factory=engine_train.TrainConfig)
    extraction: ExtractionConfig = field(default_factory=ExtractionConfig)
    init_seed: int = 0


def compare(spec: CompareSpec, out_dir: Path, *, grid: Any = None, device: str | None = None,
            log=print) -> dict[str, Any]:
    """Train a standard model and one goldfish model per mask from the same initial weights on the same documents,
    evaluate each and an untrained control on training and held-out documents, write summary.json and report.md.

    With a grid (under torchrun) every rank trains; rank 0 evaluates the consolidated checkpoint of each model and
    writes the report (other ranks return an empty dict).
    """
    started = time.perf_counter()
    main = is_main_process(grid)
    log = log if main else (lambda *a, **k: None)
    if main:
        out_dir.mkdir(parents=True, exist_ok=True)
    prepared = prepare_data(spec.data, spec.model, log=log)
    initial = initial_model(spec.model, prepared, spec.init_seed)
    if device is not None and grid is None:
        initial = initial.to(device)
    runs = [MaskSpec(strategy=None)] + [m for m in spec.masks if m.strategy is not None]
    labels = [m.label for m in runs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"duplicate masks in {labels}")
    models: dict[str, Any] = {}
    membership_results: dict[str, Any] = {}
    timings: dict[str, float] = {}

    def evaluate(label: str, model: nn.Module, mask: MaskSpec | None) -> None:
        t0 = time.perf_counter()
        models[label] = {
            part: evaluate_model(model, prepared, docs, spec.extraction, out_dir / label / "eval" / part, mask,
                                 progress=spec.train.progress, instruments=True)
            for part, docs in (("train", prepared.split.train), ("heldout", prepared.split.heldout))
        }
        if prepared.split.heldout:
            # The untrained control is the reference model of the reference-ratio attack (not of itself).
            membership_results[label] = membership(model, prepared, None if label == "control" else initial)
        timings[f"eval {label}"] = time.perf_counter() - t0

    # Standard and control models have no mask of their own; their teacher-forced accuracy is split by the first
    # goldfish mask, so one can see how well each model predicts exactly the tokens goldfish hides.
    reference_mask = next((m for m in runs if m.strategy is not None), None)
    if main:
        evaluate("control", initial, reference_mask)
    for mask in runs:
        t0 = time.perf_counter()
        train_spec = TrainSpec(model=spec.model, data=spec.data, mask=mask, train=spec.train, init_seed=spec.init_seed)
        model, _ = train_model(train_spec, out_dir / mask.label, prepared=prepared, model=copy.deepcopy(initial),
                               grid=grid, log=log)
        timings[f"train {mask.label}"] = time.perf_counter() - t0
        if grid is not None:
            # Evaluate what was saved: the consolidated HF checkpoint, as any user of the result would load it.
            if main:
                serial = load_pretrained_model(out_dir / mask.label / "checkpoint")
                evaluate(mask.label, serial, mask if mask.strategy is not None else reference_mask)
            torch.distributed.barrier()
        else:
            evaluate(mask.label, model, mask if mask.strategy is not None else reference_mask)
        if main:
            log(_one_line(mask.label, models[mask.label]))
    if not main:
        return {}

    summary = {
        "models": {label: {part: _headline(s) for part, s in parts.items()} for label, parts in models.items()},
        "details": models,
        "membership": membership_results,
        "config": {"model": spec.model, "data": asdict(spec.data), "masks": [asdict(m) | {"label": m.label}
                                                                              for m in runs],
                   "train": asdict(spec.train), "extraction": asdict(spec.extraction), "init_seed": spec.init_seed},
        "documents": prepared.split.manifest(),
        "control": "the initial weights every model started from, never trained on the documents",
        "timings_s": timings | {"total": time.perf_counter() - started},
        "grid": {axis: getattr(grid.shape, axis) for axis in GRID_AXES} if grid is not None else None,
    }
    from goldfish.report import write_compare_report

    write_compare_report(summary, out_dir)
    log(format_table(summary))
    log(f"wrote {out_dir / 'summary.json'}, {out_dir / 'report.md'} and plots in {time.perf_counter() - started:.0f} s")
    return summary


_HEADLINE_KEYS = ("n_docs", "exact_match", "rouge_l", "rouge_l_recall", "rouge_1", "rouge_2", "match_fraction",
                  "longest_correct_prefix", "tf_accuracy", "tf_kept_accuracy", "tf_dropped_accuracy")


def _headline(summary: dict[str, Any]) -> dict[str, Any]:
    return {key: summary.get(key) for key in _HEADLINE_KEYS}


def _one_line(label: str, parts: dict[str, Any]) -> str:
    train, held = parts["train"], parts["heldout"]
    return (f"{label}: train exact match {train['exact_match']:.3f} RougeL {train['rouge_l']:.3f} | "
            f"held-out exact match {held['exact_match']:.3f} RougeL {held['rouge_l']:.3f}")


def format_table(summary: dict[str, Any]) -> str:
    """A plain-text table of the headline metrics per model."""
    header = f"{'model':<28} {'train EM':>9} {'train RougeL':>13} {'held-out EM':>12} {'held-out RougeL':>16}"
    lines = [header, "-" * len(header)]
    for label, parts in summary["models"].items():
        train, held = parts["train"], parts["heldout"]
        lines.append(f"{label:<28} {train['exact_match']:>9.3f} {train['rouge_l']:>13.3f} "
                     f"{held['exact_match']:>12.3f} {held['rouge_l']:>16.3f}")
    return "\n".join(lines)
