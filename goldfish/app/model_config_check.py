"""A model folder's config.json read as untrusted input, before transformers builds anything from it.

transformers takes a config's sizes as they are: a negative `hidden_size` fails deep in torch, a float or a string
in a dataclass check, `num_hidden_layers: 1e9` allocates for minutes, a nesting thousands of levels deep ends in a
RecursionError. `check_config_file` refuses each in one line (ValueError) naming the file, the field and the fix,
reading nothing but JSON (torch-free: `goldfish plan` uses it too).
"""

from __future__ import annotations

import json
from pathlib import Path

CONFIG_MOST_BYTES = 4_000_000  # a transformers config.json is a few kilobytes
# The sizes of a decoder-only model (transformers' and GPT-2's spellings) and the largest value each may take: far
# above any released model (Llama 3.1 405B: hidden 16,384, 126 layers, 128 heads, MLP 53,248, vocabulary 128,256).
SIZE_MOST: dict[str, int] = {
    "hidden_size": 2**17,
    "n_embd": 2**17,
    "intermediate_size": 2**20,
    "n_inner": 2**20,
    "num_hidden_layers": 4096,
    "n_layer": 4096,
    "num_attention_heads": 4096,
    "n_head": 4096,
    "num_key_value_heads": 4096,
    "head_dim": 2**14,
    "vocab_size": 2**23,
    "max_position_embeddings": 2**26,
    "n_positions": 2**26,
}


def config_file_of(model: str | Path) -> Path | None:
    """The config.json `--model` names when it is local: the folder's config.json, or the file itself; None for a
    hub name, a named tiny model or a GGUF file."""
    path = Path(model)
    if path.is_dir():
        return path / "config.json" if (path / "config.json").is_file() else None
    return path if path.is_file() and path.suffix == ".json" else None


def _read(path: Path) -> dict:
    try:
        with path.open("rb") as handle:
            raw = handle.read(CONFIG_MOST_BYTES + 1)
    except OSError as error:
        raise ValueError(f"{path}: cannot read it ({error.strerror or error})") from None
    if len(raw) > CONFIG_MOST_BYTES:
        raise ValueError(f"{path}: larger than {CONFIG_MOST_BYTES:,} bytes, not a model config. Fix: give its config")
    try:
        config = json.loads(raw)
    except RecursionError:
        raise ValueError(f"{path}: its JSON is nested too deeply to be a model config. Fix: give its config") from None
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: not valid JSON ({error}). Fix: give the model's config.json") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: holds a JSON {type(config).__name__}, not an object of model settings")
    return config


def check_config_file(model: str | Path) -> None:
    """Refuse (ValueError, one line) a local model config whose sizes no model can have: each size in SIZE_MOST that
    it sets must be an integer from 1 to its bound, the attention heads must divide the hidden size (unless
    `head_dim` says otherwise) and the key/value heads the heads. Hub names and named models pass (nothing local
    to read). A nested `text_config` (multimodal configs) is checked the same way."""
    path = config_file_of(model)
    if path is None:
        return
    config = _read(path)
    for where, settings in (("", config), ("text_config.", config.get("text_config"))):
        if not isinstance(settings, dict):
            continue
        for name, most in SIZE_MOST.items():
            value = settings.get(name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                shown = json.dumps(value)[:40]
                raise ValueError(f"{path}: {where}{name} is {shown}, not an integer. Fix: give the model's config.json")
            if not 1 <= value <= most:
                raise ValueError(
                    f"{path}: {where}{name} is {value}, outside 1 to {most:,}. Fix: give the model's config.json"
                )
        _check_heads(path, where, settings)


def _check_heads(path: Path, where: str, settings: dict) -> None:
    hidden = settings.get("hidden_size", settings.get("n_embd"))
    heads = settings.get("num_attention_heads", settings.get("n_head"))
    kv_heads = settings.get("num_key_value_heads")
    if hidden and heads and "head_dim" not in settings and hidden % heads:
        raise ValueError(
            f"{path}: {where}hidden size {hidden} is not divisible by its {heads} attention heads. Fix: give the "
            "model's config.json"
        )
    if heads and kv_heads and heads % kv_heads:
        raise ValueError(
            f"{path}: {where}{heads} attention heads are not divisible by its {kv_heads} key/value heads. Fix: give "
            "the model's config.json"
        )
