"""goldfish.app.weights_folder.local_weights_folder: the local folder of safetensors weights a parallel run reads its
own parts from, for a folder and a hub name (a cache written here, read offline); None where there is none, so the
whole model is loaded as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from goldfish.app.weights_folder import local_weights_folder


def _model_folder(folder: Path, weights: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / weights).write_bytes(b"")  # local_weights_folder looks at names only; the loaders check the contents
    return folder


@pytest.fixture
def offline_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty HF hub cache that huggingface_hub reads offline in this process."""
    import huggingface_hub.constants as hub

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    return cache


def _cached(cache: Path, repo: str, weights: str) -> Path:
    revision = "1" * 40
    entry = cache / f"models--{repo.replace('/', '--')}"
    snapshot = _model_folder(entry / "snapshots" / revision, weights)
    (entry / "refs").mkdir()
    (entry / "refs" / "main").write_text(revision)
    return snapshot


def test_a_folder_of_safetensors_weights_is_itself(tmp_path: Path) -> None:
    folder = _model_folder(tmp_path / "model", "model.safetensors")
    assert local_weights_folder(str(folder), None) == folder


def test_a_folder_of_pickled_weights_has_none(tmp_path: Path) -> None:
    assert local_weights_folder(str(_model_folder(tmp_path / "model", "pytorch_model.bin")), None) is None


def test_a_hub_name_is_its_cached_snapshot(offline_hub: Path) -> None:
    snapshot = _cached(offline_hub, "acme/tiny", "model.safetensors")
    assert local_weights_folder("acme/tiny", None) == snapshot


def test_a_hub_name_of_pickled_weights_or_not_cached_has_none(offline_hub: Path) -> None:
    _cached(offline_hub, "acme/pickled", "pytorch_model.bin")
    assert local_weights_folder("acme/pickled", None) is None
    assert local_weights_folder("acme/not-cached", None) is None  # offline: the whole-model load says why
    assert local_weights_folder("not a/valid/repo id", None) is None
