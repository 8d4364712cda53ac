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
from typing import Any, Callable, Sequence

import torch
from torch import nn

import data
import engine.train as engine_train
from eval.adaptive import SamplingConfig
from eval.breakdown import group_means, tag_rows
from eval.divergence import divergence_row, divergence_summary, suffix_dropped_flags
from eval.extraction import ExtractionConfig, write_extraction
from data.atomic import write_jsonl_atomic
from goldfish import parallel_eval
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
    # Times each training document occurs per epoch, assigned round-robin over the selected training documents:
    # (1, 4) repeats the 1st, 3rd, 5th ... document once and the 2nd, 4th ... four times per epoch.
    repeats: tuple[int, ...] = (1,)

    def __post_init__(self) -> None:
        if self.vocab_size < 300:
            raise ValueError(f"vocab_size must be >= 300 (256 bytes plus merges and special tokens), got {self.vocab_size}")
        self.repeats = tuple(self.repeats)
        if not self.repeats or any(not isinstance(r, int) or r < 1 for r in self.repeats):
            raise ValueError(f"repeats must be integers >= 1 (times a training document occurs per epoch), "
                             f"got {self.repeats!r}")

    def repeats_by_id(self, documents: Sequence[data.TokenizedDocument]) -> dict[str, int]:
        """{document id: times it occurs per training epoch}, round-robin over `documents` in selection order."""
        return {str(doc.id): self.repeats[i % len(self.repeats)] for i, doc in enumerate(documents)}


def parse_repeats(text: str) -> tuple[int, ...]:
    """Parse '1,2,4,8' into (1, 2, 4, 8)."""
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"cannot parse repeats {text!r}: use comma-separated integers >= 1, e.g. 1,4,16") from None
    if any(v < 1 for v in values):
        raise ValueError(f"repeats {text!r} must all be >= 1")
    return values


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


def grid_sizes(grid: Any) -> dict[str, int]:
    """{axis: size} of an engine grid, as recorded in run records and summaries."""
    return {axis: getattr(grid.shape, axis) for axis in GRID_AXES}


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
                  special_token_ids: Sequence[int],
                  repeats: dict[str, int] | None = None) -> list[dict[str, torch.Tensor]]:
    """Training examples: input ids, next-token targets and the goldfish drop mask, all (T,); one per document, or
    `repeats[id]` copies of it. Hashed and static masks are functions of the tokens, so every copy drops the same
    positions (the point of the hashed mask).

    For the `random` strategy the stored mask is only the first epoch's draw (for counting); the loss redraws it
    every step and for every copy, since a per-occurrence Bernoulli mask must differ each time a sequence is seen.
    """
    examples = []
    for document in documents:
        input_ids = torch.tensor(document.token_ids, dtype=torch.long)
        targets = causal_targets(input_ids.unsqueeze(0))
        copies = 1 if repeats is None else repeats[str(document.id)]
        for _ in range(copies):
            index = len(examples)
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
        "repeats": spec.data.repeats_by_id(prepared.split.train),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
    }
    return record


def train_model(spec: TrainSpec, out_dir: Path, *, prepared: Prepared | None = None, model: nn.Module | None = None,
                resume_from: Path | None = None, grid: Any = None, log=print,
                on_epoch_end: Callable[[nn.Module, int, int], None] | None = None) -> tuple[nn.Module, Prepared]:
    """Train one model and write OUT/checkpoint (an HF checkpoint + tokenizer + trainer state) and OUT/metrics.jsonl.

    on_epoch_end(model, epoch, step) runs after each epoch on every rank (see engine.train.train).
    """
    prepared = prepared or prepare_data(spec.data, spec.model, log=log)
    model = model if model is not None else initial_model(spec.model, prepared, spec.init_seed)
    if resume_from is not None:
        load_model_weights(model, resume_from)  # full weights: valid at any grid, sharded below
    repeats = spec.data.repeats_by_id(prepared.split.train)
    examples = make_examples(prepared.split.train, spec.mask, prepared.special_token_ids, repeats)
    n_dropped = sum(int(e["dropped"].sum()) for e in examples)
    n_targets = sum(int((e["targets"] != -100).sum()) for e in examples)
    repeated = "" if set(repeats.values()) == {1} else \
        f" ({len(prepared.split.train)} documents repeated {'/'.join(map(str, spec.data.repeats))} times per epoch)"
    log(f"train {spec.mask.label}: {len(examples)} sequences{repeated}, {n_dropped}/{n_targets} targets dropped "
        f"({n_dropped / max(n_targets, 1):.3f}), {spec.train.epochs} epochs"
        + (f", grid {grid.shape}" if grid is not None else ""))
    record = run_record(spec, prepared)
    if grid is not None:
        import engine

        record["grid"] = grid_sizes(grid)
        model = engine.parallelize(model.to(grid.device), grid)
        save = lambda m, d: save_parallel_hf_model(m, grid, prepared.tokenizer, record, d)  # noqa: E731
    else:
        save = lambda m, d: save_hf_model(m, prepared.tokenizer, record, d)  # noqa: E731
    if is_main_process(grid):
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "run.json").write_text(json.dumps(record, indent=2))
    engine_train.train(model, examples, make_step_loss(spec.mask, prepared.special_token_ids), spec.train,
                       out_dir=out_dir, grid=grid, resume_from=resume_from, save_model=save, on_epoch_end=on_epoch_end)
    return model, prepared


@dataclass
class Instruments:
    """The memorization instruments run besides greedy extraction (research.md section 2).

    divergence: where greedy decoding first leaves the true suffix, and whether that position is a dropped one.
    probabilistic: exact probability that sampling at temperature 1 emits the true suffix (one teacher-forced pass).
    beams: beam-search extraction with this many beams (0 = off; the goldfish paper's attack uses 30).
    samples: sampling extraction with this many samples per document (0 = off), at `temperature` and `top_p`.
    prefix_lengths: greedy extraction again with each of these fixed prefix lengths (empty = off).
    """

    divergence: bool = True
    probabilistic: bool = True
    beams: int = 0
    samples: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    sample_seed: int = 0
    prefix_lengths: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        self.prefix_lengths = tuple(int(p) for p in self.prefix_lengths)
        if self.beams < 0 or self.beams == 1:
            raise ValueError(f"beams must be 0 (off) or >= 2, got {self.beams} (1 beam is greedy extraction)")
        if self.samples < 0:
            raise ValueError(f"samples must be >= 0 (0 = off), got {self.samples}")
        if any(p < 1 for p in self.prefix_lengths):
            raise ValueError(f"prefix lengths must be >= 1, got {self.prefix_lengths}")
        self.sampling()  # validates temperature and top_p

    def sampling(self) -> SamplingConfig:
        return SamplingConfig(temperature=self.temperature, top_p=self.top_p, n_samples=max(self.samples, 1),
                              seed=self.sample_seed)


# What the per-document rows of each instrument are saved as, next to extraction.jsonl.
ROW_FILES = {"divergence": "divergence.jsonl", "probabilistic": "probabilistic.jsonl", "beam": "beam.jsonl",
             "sampling": "sampling.jsonl", "prefix_length": "prefix_length.jsonl"}
REPEAT_METRICS = ("exact_match", "rouge_l")
# Per-document fields kept for every point of the exact-match-vs-epochs curve (OUT/<label>/curve.jsonl).
CURVE_ROW_KEYS = ("id", "exact_match", "rouge_l", "longest_correct_prefix")


def evaluate_model(model: nn.Module, prepared: Prepared, documents: Sequence[data.TokenizedDocument],
                   extraction: ExtractionConfig, out_dir: Path | None, mask: MaskSpec | None = None,
                   progress: bool = True, *, instruments: Instruments | None = None,
                   repeats: dict[str, int] | None = None, grid: Any = None) -> dict[str, Any] | None:
    """Greedy extraction on `documents` plus the chosen `instruments`; returns the summary.

    Writes OUT/extraction.jsonl, OUT/summary.json and one JSON-lines file of per-document rows per instrument
    (ROW_FILES) when out_dir is given. Instrument summaries go under "divergence", "probabilistic", "beam",
    "sampling" and "breakdowns" ({"prefix_length": [...], "repeats": [...]}).
    repeats: {document id: times it was trained on per epoch}; documents not in it count as 0 (never trained on).
        Each extraction row gets a "repeats" field and the summary a breakdown by it.
    grid: under torchrun, every rank calls this with the same arguments and a model parallelized on the grid
        (goldfish.parallel_eval.load_parallel_model); documents are sharded over the data axis and rank 0 gets the
        summary and writes the files (other ranks get None). The rows equal a single process's.
    """
    summary, _ = _evaluate(model, prepared, documents, extraction, out_dir, mask, progress, instruments, repeats, grid)
    return summary


def _evaluate(model: nn.Module, prepared: Prepared, documents: Sequence[data.TokenizedDocument],
              extraction: ExtractionConfig, out_dir: Path | None, mask: MaskSpec | None, progress: bool,
              instruments: Instruments | None, repeats: dict[str, int] | None, grid: Any = None
              ) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]] | tuple[None, None]:
    """evaluate_model, also returning the per-document rows: {"extraction": rows, instrument: rows, ...}.

    Every instrument runs through goldfish.parallel_eval, which is the plain single-process function for grid None
    and the sharded one under a grid; only rank 0 gets rows back.
    """
    tokenizer = prepared.tokenizer
    special = prepared.special_token_ids
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    mask_fn = None
    if mask is not None and mask.strategy is not None:
        mask_fn = lambda targets: mask.dropped(targets, special)  # noqa: E731
    pad_id = pad_token_id(tokenizer)
    main = is_main_process(grid)
    clock = time.perf_counter()
    timings: dict[str, float] = {}

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        timings[name] = round(now - clock, 3)
        clock = now

    rows, summary = parallel_eval.evaluate_parallel(model, documents, extraction, grid, decode=decode,
                                                    pad_token_id=pad_id, drop_mask_fn=mask_fn,
                                                    progress=progress and main)
    lap("greedy")
    results: dict[str, Any] = {}  # instrument -> (rows, summary); None on ranks other than 0
    if instruments is not None:
        if instruments.probabilistic:
            results["probabilistic"] = parallel_eval.probabilistic_parallel(model, documents, extraction, grid,
                                                                            pad_token_id=pad_id)
            lap("probabilistic")
        if instruments.beams:
            results["beam"] = parallel_eval.beam_parallel(model, documents, extraction, grid,
                                                          num_beams=instruments.beams, pad_token_id=pad_id,
                                                          decode=decode)
            lap("beam")
        if instruments.samples:
            results["sampling"] = parallel_eval.sampling_parallel(model, documents, extraction,
                                                                  instruments.sampling(), grid, pad_token_id=pad_id)
            lap("sampling")
        if instruments.prefix_lengths:
            prefix_rows = parallel_eval.prefix_length_parallel(
                model, documents, instruments.prefix_lengths, grid, suffix_len=extraction.suffix_len,
                batch_size=extraction.batch_size, decode=decode, pad_token_id=pad_id)
            results["prefix_length"] = (prefix_rows, None)
            lap("prefix_length")
    if not main:
        return None, None

    breakdowns: dict[str, Any] = {}
    if repeats is not None:
        rows = tag_rows(rows, "repeats", repeats, default=0)
        breakdowns["repeats"] = group_means(rows, "repeats", REPEAT_METRICS)
    per_document: dict[str, list[dict[str, Any]]] = {"extraction": rows}
    if instruments is not None and instruments.divergence:
        per_document["divergence"] = _divergence_rows(rows, documents, extraction, mask_fn)
        summary["divergence"] = divergence_summary(per_document["divergence"])
    for name, (instrument_rows, instrument_summary) in results.items():
        per_document[name] = instrument_rows
        if instrument_summary is not None:
            summary[name] = instrument_summary
    if "prefix_length" in per_document:
        breakdowns["prefix_length"] = group_means(per_document["prefix_length"], "prefix_len", REPEAT_METRICS)
    if breakdowns:
        summary["breakdowns"] = breakdowns
    summary["timings_s"] = timings
    if out_dir is not None:
        write_extraction(rows, summary, out_dir)
        for name, instrument_rows in per_document.items():
            if name != "extraction":
                write_jsonl_atomic(out_dir / ROW_FILES[name], instrument_rows)
    return summary, per_document


def pad_token_id(tokenizer: Any) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def _divergence_rows(rows: list[dict[str, Any]], documents: Sequence[data.TokenizedDocument],
                     extraction: ExtractionConfig, mask_fn: Any) -> list[dict[str, Any]]:
    """Per-document divergence rows (id, n_prefix_tokens, first_divergence, and the mask's flags when given)."""
    by_id = {d.id: d for d in documents}
    divergence_rows = []
    for row in rows:
        ids = by_id[row["id"]].token_ids
        prefix_len, suffix_len = row["n_prefix_tokens"], extraction.suffix_len
        flags = None
        if mask_fn is not None:
            dropped = mask_fn(causal_targets(torch.tensor([ids])))[0]
            flags = suffix_dropped_flags(dropped, prefix_len, suffix_len)
        divergence_rows.append({"id": row["id"], "n_prefix_tokens": prefix_len,
                                **divergence_row(row["generated_ids"], ids[prefix_len:prefix_len + suffix_len], flags)})
    return divergence_rows


def membership(model: nn.Module, prepared: Prepared, reference: nn.Module | None,
               out_file: Path | None = None, grid: Any = None) -> dict[str, Any] | None:
    """Membership inference (loss, zlib, Min-K%, and reference-model ratio when `reference` is given): members are
    the training documents, non-members the held-out ones; AUC and TPR at 1% and 0.1% FPR. The per-document scores
    go to `out_file` (JSON lines) when given. Under a grid, documents are sharded over the data axis and rank 0 gets
    the result (other ranks None)."""
    tokenizer = prepared.tokenizer
    if not prepared.split.train or not prepared.split.heldout:
        raise ValueError("membership inference needs both training (members) and held-out (non-member) documents")
    rows, summary = parallel_eval.membership_parallel(
        model, prepared.split.train, prepared.split.heldout, grid,
        decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True), pad_token_id=pad_token_id(tokenizer),
        reference_model=reference)
    if rows is None:
        return None
    if out_file is not None:
        write_jsonl_atomic(out_file, rows)
    return summary


@dataclass
class CompareSpec:
    """A standard-vs-goldfish comparison. curve_every: measure greedy extraction of the training documents every N
    epochs during training (0 = off; the last epoch is always measured when on)."""

    model: str = "tiny-llama"
    data: DataSpec = field(default_factory=DataSpec)
    masks: list[MaskSpec] = field(default_factory=lambda: [MaskSpec("hashed", 4, 13)])
    train: engine_train.TrainConfig = field(default_factory=engine_train.TrainConfig)
    extraction: ExtractionConfig = field(default_factory=ExtractionConfig)
    init_seed: int = 0
    instruments: Instruments = field(default_factory=Instruments)
    curve_every: int = 0

    def __post_init__(self) -> None:
        if self.curve_every < 0:
            raise ValueError(f"curve_every must be >= 0 (0 = no curve), got {self.curve_every}")


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
    repeats = spec.data.repeats_by_id(prepared.split.train) if spec.data.repeats != (1,) else None
    models: dict[str, Any] = {}
    membership_results: dict[str, Any] = {}
    curves: dict[str, list[dict[str, Any]]] = {}
    breakdowns: dict[str, dict[str, Any]] = {}
    timings: dict[str, float] = {}

    control_rows: list[dict[str, Any]] = []  # the control's training-document rows: epoch 0 of every curve

    def evaluate(label: str, model: nn.Module, mask: MaskSpec | None) -> None:
        t0 = time.perf_counter()
        models[label], rows = {}, {}
        for part, docs in (("train", prepared.split.train), ("heldout", prepared.split.heldout)):
            models[label][part], per_document = _evaluate(
                model, prepared, docs, spec.extraction, out_dir / label / "eval" / part, mask, spec.train.progress,
                spec.instruments, None if repeats is None else repeats if part == "train" else {})
            rows[part] = per_document["extraction"]
        if label == "control":
            control_rows.extend(rows["train"])
        if repeats is not None:
            # Held-out documents are the "trained on 0 times" group of the repeats breakdown.
            breakdowns.setdefault("repeats", {})[label] = group_means(rows["train"] + rows["heldout"], "repeats",
                                                                      REPEAT_METRICS)
        by_prefix = models[label]["train"].get("breakdowns", {}).get("prefix_length")
        if by_prefix is not None:
            breakdowns.setdefault("prefix_length", {})[label] = by_prefix
        if prepared.split.heldout:
            # The untrained control is the reference model of the reference-ratio attack (not of itself).
            membership_results[label] = membership(model, prepared, None if label == "control" else initial,
                                                   out_dir / label / "eval" / "membership.jsonl")
        timings[f"eval {label}"] = time.perf_counter() - t0

    def add_curve_point(curve: list[dict[str, Any]], curve_rows: list[dict[str, Any]], epoch: int, step: int,
                        rows: list[dict[str, Any]], point: dict[str, Any]) -> None:
        """Append one measured epoch: the summary point to `curve`, the per-document rows to `curve_rows`."""
        curve.append({"epoch": epoch, "step": step, "exact_match": point["exact_match"], "rouge_l": point["rouge_l"],
                      "n_docs": point["n_docs"]})
        curve_rows.extend({"epoch": epoch, "step": step, **{key: row[key] for key in CURVE_ROW_KEYS}} for row in rows)

    # Standard and control models have no mask of their own; their teacher-forced accuracy is split by the first
    # goldfish mask, so one can see how well each model predicts exactly the tokens goldfish hides.
    reference_mask = next((m for m in runs if m.strategy is not None), None)
    warnings: list[str] = []
    if main:
        evaluate("control", initial, reference_mask)
        already = models["control"]["train"]["exact_match"] or 0.0
        if already > 0:
            # A pretrained model may know some documents before fine-tuning (e.g. text from its own pretraining
            # data): extraction then measures that, not what the fine-tuning memorized.
            warnings.append(f"the untrained control already extracts {already:.3f} of the training documents: they "
                            "are memorized before fine-tuning; choose other documents (--data, --data-seed) to "
                            "measure what training adds")
            log("warning: " + warnings[-1])
    curve_on = spec.curve_every > 0
    for mask in runs:
        t0 = time.perf_counter()
        train_spec = TrainSpec(model=spec.model, data=spec.data, mask=mask, train=spec.train, init_seed=spec.init_seed)
        curve: list[dict[str, Any]] = []
        curve_rows: list[dict[str, Any]] = []  # per document and measured epoch, written to OUT/<label>/curve.jsonl
        if curve_on and main:  # epoch 0: the initial weights, already evaluated as the control
            add_curve_point(curve, curve_rows, 0, 0, control_rows, models["control"]["train"])

        def on_epoch_end(model: nn.Module, epoch: int, step: int) -> None:
            if epoch % spec.curve_every == 0 or epoch == spec.train.epochs:
                # Under a grid every rank takes part (documents sharded over data, the model's own shards).
                rows, point = parallel_eval.evaluate_parallel(
                    model, prepared.split.train, spec.extraction, grid, pad_token_id=pad_token_id(prepared.tokenizer),
                    decode=lambda ids: prepared.tokenizer.decode(ids, skip_special_tokens=True))
                if point is not None:  # rank 0
                    add_curve_point(curve, curve_rows, epoch, step, rows, point)

        model, _ = train_model(train_spec, out_dir / mask.label, prepared=prepared, model=copy.deepcopy(initial),
                               grid=grid, log=log, on_epoch_end=on_epoch_end if curve_on else None)
        if curve_on and main:
            curves[mask.label] = curve
            write_jsonl_atomic(out_dir / mask.label / "curve.jsonl", curve_rows)
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
        "curves": curves,
        "breakdowns": breakdowns,
        "config": {"model": spec.model, "data": asdict(spec.data), "masks": [asdict(m) | {"label": m.label}
                                                                              for m in runs],
                   "train": asdict(spec.train), "extraction": asdict(spec.extraction), "init_seed": spec.init_seed,
                   "instruments": asdict(spec.instruments), "curve_every": spec.curve_every},
        "documents": prepared.split.manifest(),
        "repeats": repeats,
        "control": "the initial weights every model started from, never trained on the documents",
        "warnings": warnings,
        "timings_s": timings | {"total": time.perf_counter() - started},
        "grid": grid_sizes(grid) if grid is not None else None,
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
