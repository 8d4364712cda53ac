"""LoRA fine-tuning through `peft`: wrap a causal LM's Linear layers by name, merge for evaluation and saving.

    spec = LoraSpec(rank=8, alpha=16, targets=("q_proj", "v_proj"))
    model = apply_lora(model, spec, seed=0)     # a peft.PeftModel; only the adapters require grad
    ...train with the goldfish loss as usual...
    save_lora(model, folder)                    # folder: merged HF model; folder/adapter: the peft adapter
    plain = merged_model(model)                 # an ordinary transformers model (W + alpha/r * B A)

peft is imported when LoRA is used (the `lora` extra), never by `import goldfish`; torch when a model is wrapped, so
LoraSpec and the checks of the settings import without it.
"""

from __future__ import annotations

import copy
import importlib.util
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch loads where a model is wrapped: the settings and their checks stay torch-free
    from torch import nn

PEFT_REQUIREMENT = "peft>=0.21"  # the `lora` extra's pin in pyproject.toml (tests/e2e/test_newcomer_frictions.py)
ALL_LINEAR = "all-linear"  # peft's name for every Linear layer of the model except the output head
ADAPTER_DIR = "adapter"  # subfolder of a checkpoint holding the peft adapter (adapter_config.json + weights)


@dataclass(frozen=True)
class LoraSpec:
    """LoRA settings (the --lora-* options). rank: r of the low-rank update B A (B: out x r, A: r x in); 0 = off
    (full fine-tuning); alpha: the update is scaled by alpha / r (None: 2 * rank); targets: names of the Linear
    layers to adapt (the last component of a module's name, e.g. q_proj), or ("all-linear",) for every Linear
    layer except the output head. No dropout, so that a run is deterministic."""

    rank: int = 0
    alpha: float | None = None
    targets: tuple[str, ...] = (ALL_LINEAR,)

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0:
            raise ValueError(f"--lora-rank must be an integer >= 1 (0 = no LoRA), got {self.rank!r}")
        if isinstance(self.targets, str):
            object.__setattr__(self, "targets", parse_targets(self.targets))
        if self.alpha is not None and not self.alpha > 0:
            raise ValueError(f"--lora-alpha must be > 0, got {self.alpha!r}")
        targets = tuple(t.strip() for t in self.targets if t.strip())
        if not targets:
            raise ValueError("--lora-targets names no module; give e.g. q_proj,v_proj or all-linear")
        if ALL_LINEAR in targets and len(targets) > 1:
            raise ValueError(f"--lora-targets: {ALL_LINEAR} already takes every Linear layer; give it alone")
        object.__setattr__(self, "targets", targets)

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scale_alpha(self) -> float:
        return float(self.alpha) if self.alpha is not None else 2.0 * self.rank

    @property
    def label(self) -> str:
        return f"lora-r{self.rank}"


def parse_targets(text: str) -> tuple[str, ...]:
    """'q_proj,v_proj' -> ('q_proj', 'v_proj')."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def linear_module_names(model: nn.Module) -> list[str]:
    """The distinct last name components of the model's Linear layers (nn.Linear and GPT-2's Conv1D)."""
    from torch import nn

    names = set()
    for name, module in model.named_modules():
        if name and (isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"):
            names.add(name.rsplit(".", 1)[-1])
    return sorted(names)


def check_targets(model: nn.Module, spec: LoraSpec) -> None:
    """Raise ValueError naming the Linear layers that exist when a target names none."""
    if spec.targets == (ALL_LINEAR,):
        return
    existing = linear_module_names(model)
    missing = [t for t in spec.targets if t not in existing]
    if missing:
        raise ValueError(
            f"--lora-targets {','.join(missing)}: {type(model).__name__} has no Linear layer of that name; "
            f"its Linear layers are {','.join(existing)} (or use {ALL_LINEAR})"
        )


def missing_peft() -> str:
    """The one line that says peft is missing and how to install it from any folder (an editable install's
    `-e ".[lora]"` works from the repository root only)."""
    return (
        f"--lora-rank needs the peft package, which is not installed. Fix: pip install '{PEFT_REQUIREMENT}' "
        "(or leave --lora-rank out to train every weight)"
    )


def check_peft() -> None:
    """Refuse a LoRA run (ValueError, one line) when peft is not installed: looked up without importing it, so the
    check costs nothing and runs before any data or model is loaded."""
    try:
        found = importlib.util.find_spec("peft") is not None
    except (ImportError, ValueError):  # a broken or half-imported peft
        found = False
    if not found:
        raise ValueError(missing_peft())


def check_grid(sizes: dict[str, int]) -> None:
    """LoRA runs on the data axis only; refuse tensor-parallel axes with the reason and the fix."""
    tensor = {axis: sizes.get(axis, 1) for axis in ("x", "y", "z") if sizes.get(axis, 1) > 1}
    if tensor:
        raise ValueError(
            "LoRA runs on the data axis only: the engine shards each decoder Linear over x/y/z while "
            "peft wraps the same Linear layers, and LoRA's A and B matrices are not sharded; got "
            + ",".join(f"{a}={s}" for a, s in tensor.items())
            + ". Use --grid data=N (N = number of processes) with --lora-rank"
        )


def check_zero(stage: int) -> None:
    """LoRA trains adapters only, whose AdamW state is already small; partitioning it over the data axis (ZeRO)
    is not supported with peft's wrapped layers: refuse the combination."""
    if stage:
        raise ValueError(
            f"--lora-rank with --zero {stage} is not supported (ZeRO partitions the model the engine "
            "built, not peft's adapters, and the adapters' optimizer state is small anyway): drop --zero"
        )


def apply_lora(model: nn.Module, spec: LoraSpec, *, seed: int = 0) -> nn.Module:
    """Wrap `model` (an HF causal LM) with LoRA adapters; return the peft.PeftModel. Freezes every base weight.

    A is drawn from the generator seeded with `seed` (peft's Kaiming-uniform init), B starts at zero, so
    the wrapped model computes exactly what the base model does until the first step.
    """
    if not spec.enabled:
        raise ValueError("apply_lora needs --lora-rank >= 1")
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as error:
        raise ImportError(missing_peft()) from error
    check_targets(model, spec)
    config = LoraConfig(
        r=spec.rank,
        lora_alpha=spec.scale_alpha,
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
        target_modules=ALL_LINEAR if spec.targets == (ALL_LINEAR,) else list(spec.targets),
    )
    import torch

    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        # peft asks the model for transformers' deprecated `is_gradient_checkpointing`: a FutureWarning about
        # peft's code that the user cannot act on, held back here only
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.* is deprecated", category=FutureWarning)
        torch.manual_seed(seed)
        return get_peft_model(model, config)


def is_lora_model(model: nn.Module) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "merge_and_unload")


def merged_model(model: nn.Module) -> nn.Module:
    """A plain transformers model with the adapters merged into the weights (the LoRA model is left as is)."""
    if not is_lora_model(model):
        raise ValueError("merged_model expects a LoRA (peft) model")
    merged = copy.deepcopy(model).merge_and_unload()
    for param in merged.parameters():
        param.requires_grad_(True)
    return merged


def save_lora(model: nn.Module, directory: Path, save_plain: Any) -> None:
    """Write the merged model with `save_plain(plain_model, directory)` (an ordinary HF checkpoint) and the
    peft adapter into directory/adapter."""
    save_plain(merged_model(model), directory)
    model.save_pretrained(str(directory / ADAPTER_DIR))


def load_adapter_weights(model: nn.Module, checkpoint: Path) -> None:
    """Load the adapter saved in checkpoint/adapter into a LoRA model built with the same spec (for resume)."""
    from peft.utils import set_peft_model_state_dict
    from safetensors.torch import load_file

    path = Path(checkpoint) / ADAPTER_DIR / "adapter_model.safetensors"
    if not path.is_file():
        raise ValueError(
            f"{checkpoint} holds no LoRA adapter ({path} is missing): resume a LoRA run from the "
            "checkpoint of a LoRA run with the same --lora-* options"
        )
    result = set_peft_model_state_dict(model, load_file(str(path)))
    if result.unexpected_keys:
        raise ValueError(
            f"the adapter in {checkpoint} does not fit this model (unexpected {result.unexpected_keys[:4]})"
            "; resume with the --lora-* options of the run that wrote it"
        )
