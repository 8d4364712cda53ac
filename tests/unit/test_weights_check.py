"""A truncated safetensors file is named in a one-line error with the fix, before any loader reads it."""

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.training.checkpoint import CheckpointError, check_model_folder, check_safetensors


def test_truncated_safetensors_one_line_error(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"a": torch.arange(100, dtype=torch.float32), "b": torch.ones(3, 4)}, str(path))
    whole = path.read_bytes()
    check_safetensors(path)
    check_model_folder(tmp_path)
    header_end = 8 + int.from_bytes(whole[:8], "little")
    for cut in (4, 20, header_end, len(whole) - 1):
        path.write_bytes(whole[:cut])
        with pytest.raises(Exception):
            load_file(str(path))  # what a loader would hit: a SafetensorError deep in a traceback
        with pytest.raises(CheckpointError) as info:
            check_model_folder(tmp_path, fix="re-save it with goldfish")
        message = str(info.value)
        assert "\n" not in message and str(path) in message and "truncated" in message
        assert message.endswith("Fix: re-save it with goldfish.")
    path.write_bytes(whole[:8] + b"{not json" + whole[17:])
    with pytest.raises(CheckpointError, match="corrupt safetensors header"):
        check_safetensors(path)
