"""Nested training state (step, schedule, RNG, optimizer state) as JSON plus safetensors: nothing is unpickled.

A checkpoint is shared between people like a model is, so reading one must never run code. Pickle (`torch.save`,
`torch.load(weights_only=False)`) rebuilds arbitrary objects and runs whatever a crafted file names; this format
holds data only:

    NAME.json            {"format": "goldfish-state", "version": 1, "state": <the structure>}
    NAME.safetensors     every tensor of the state, under the names the structure refers to ("0", "1", ...)

The structure is JSON with four tagged forms for what JSON lacks: {"$tensor": "N"} (tensor N of the safetensors
file, e.g. an RNG state as uint8 or AdamW's exp_avg), {"$tuple": [...]}, {"$float": "nan" | "inf" | "-inf"} and
{"$dict": [[key, value], ...]} (a dict whose keys are not all strings, or whose string keys start with "$", e.g.
an optimizer's state by parameter index). None, bools, ints, strings, lists and other dicts are plain JSON. Anything
else (a class instance, a function, a numpy array) is refused when saving, with the path of the offending entry.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from data.atomic import write_atomic, write_text_atomic

FORMAT = "goldfish-state"
VERSION = 1


class StateFileError(ValueError):
    """A state that cannot be stored without pickling, or a state file pair that cannot be read."""


def _json_path(stem: Path) -> Path:
    return stem.with_name(stem.name + ".json")


def _tensors_path(stem: Path) -> Path:
    return stem.with_name(stem.name + ".safetensors")


def state_files(stem: str | Path) -> tuple[Path, Path]:
    """The two files (JSON structure, safetensors tensors) of the state stored under `stem`."""
    stem = Path(stem)
    return _json_path(stem), _tensors_path(stem)


class _TensorStore:
    """The tensors of a state being encoded, named "0", "1", ... in the order met."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self._names: dict[int, str] = {}  # id of a tensor of the state -> its name (one tensor met twice: stored once)
        self._storages: set[int] = set()

    def add(self, value: torch.Tensor, where: str) -> str:
        if id(value) in self._names:
            return self._names[id(value)]
        tensor = value.detach().cpu()
        if tensor.layout != torch.strided:
            raise StateFileError(f"{where} is a {tensor.layout} tensor; only dense tensors can be stored")
        # safetensors stores each tensor's whole storage, once: a view of a larger storage, a non-contiguous tensor
        # and a second tensor over a storage already stored are copied
        storage = tensor.untyped_storage()
        whole = storage.nbytes() == tensor.numel() * tensor.element_size()
        if not tensor.is_contiguous() or not whole or storage.data_ptr() in self._storages:
            tensor = tensor.clone(memory_format=torch.contiguous_format)
        if tensor.numel():
            self._storages.add(tensor.untyped_storage().data_ptr())
        name = str(len(self.tensors))
        self.tensors[name] = tensor
        self._names[id(value)] = name
        return name


def _encode(value: Any, where: str, store: _TensorStore) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return {"$float": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    if isinstance(value, torch.Tensor):
        return {"$tensor": store.add(value, where)}
    if isinstance(value, tuple):
        return {"$tuple": [_encode(v, f"{where}[{i}]", store) for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, f"{where}[{i}]", store) for i, v in enumerate(value)]
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in value):
            return {k: _encode(v, f"{where}[{k!r}]", store) for k, v in value.items()}
        return {
            "$dict": [
                [_encode(k, f"{where} key", store), _encode(v, f"{where}[{k!r}]", store)] for k, v in value.items()
            ]
        }
    raise StateFileError(
        f"{where} is a {type(value).__module__}.{type(value).__qualname__}; a checkpoint stores only tensors, "
        "numbers, strings, None and lists, tuples or dicts of them (never pickled objects). Fix: store its "
        "state_dict() or plain values instead"
    )


def _decode(value: Any, tensors: dict[str, torch.Tensor], path: Path) -> Any:
    if isinstance(value, list):
        return [_decode(v, tensors, path) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        ((tag, inner),) = value.items()
        if tag == "$tensor":
            if inner not in tensors:
                raise StateFileError(f"{path} refers to tensor {inner!r}, which its .safetensors file lacks")
            return tensors[inner]
        if tag == "$tuple":
            return tuple(_decode(v, tensors, path) for v in inner)
        if tag == "$float":
            if inner not in ("nan", "inf", "-inf"):
                raise StateFileError(f"{path} holds an unknown float {inner!r}")
            return float(inner)
        if tag == "$dict":
            return {_decode(k, tensors, path): _decode(v, tensors, path) for k, v in inner}
    if any(isinstance(k, str) and k.startswith("$") for k in value):
        raise StateFileError(f"{path} holds an unknown tagged value {sorted(value)[:3]}")
    return {k: _decode(v, tensors, path) for k, v in value.items()}


def save_state(stem: str | Path, state: Any, name: str = "state") -> tuple[Path, Path]:
    """Write `state` as STEM.json + STEM.safetensors (each atomically); return both paths.

    name: how the state is called in the error for a value that cannot be stored (e.g. "extra_state")."""
    store = _TensorStore()
    structure = _encode(state, name, store)
    tensors = store.tensors
    json_path, tensors_path = state_files(stem)
    # tensors first: a JSON file that exists refers to tensors already on disk
    write_atomic(tensors_path, lambda tmp: save_file(tensors, str(tmp), metadata={"format": FORMAT}))
    text = json.dumps({"format": FORMAT, "version": VERSION, "state": structure}, indent=1, allow_nan=False)
    write_text_atomic(json_path, text + "\n")
    return json_path, tensors_path


def load_state(stem: str | Path) -> Any:
    """The state `save_state` wrote under `stem`. Reads JSON and safetensors only; raises FileNotFoundError when
    STEM.json is missing and StateFileError for a file that is incomplete, corrupt or of another format."""
    json_path, tensors_path = state_files(stem)
    raw = json_path.read_bytes()  # FileNotFoundError: the caller says what is missing
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise StateFileError(f"{json_path} is corrupt, not a JSON file ({error})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise StateFileError(f"{json_path} is not a goldfish state file")
    if data.get("version") != VERSION:
        raise StateFileError(f"{json_path} has format version {data.get('version')}, this release reads {VERSION}")
    if not tensors_path.is_file():
        raise StateFileError(f"{tensors_path} is missing (it holds the tensors {json_path.name} refers to)")
    try:
        tensors = load_file(str(tensors_path))
    except (SafetensorError, OSError) as error:
        raise StateFileError(f"{tensors_path} is corrupt or truncated ({error})") from None
    try:
        return _decode(data["state"], tensors, json_path)
    except (KeyError, TypeError, ValueError) as error:
        if isinstance(error, StateFileError):
            raise
        raise StateFileError(f"{json_path} has a malformed structure ({error})") from None
