"""Sharded checkpoints: exact resume at the same grid, re-sharding to other grids and world sizes, serial
resume, consolidation into a plain HF checkpoint, atomicity under crashes, clear errors.

Re-sharding itself only moves data, so it is checked bit-exactly: after save at one grid and load at
another (or into a serial model), the full weights and the full AdamW states gathered with the engine's
own gather equal the saving run's. Llama (grouped heads, biases) and GPT-2 (Conv1D layout, fused c_attn
whose outputs the engine regroups per y rank) are both covered.

Training reference: an uninterrupted engine.training.train run of a tiny HF Llama (float32) at grid x=2,y=2, crashed
after its step-2 checkpoint and resumed at the same grid, at other grids of 4 and 2 ranks, in one process;
and a single-process run's checkpoint resumed at a grid of 2 ranks.

Tolerance for resumes at another grid (or in one process): the loss is the same mathematical quantity but
the float32 sums run in other orders (rows split over 2 or 4 ranks, partial products over x/y, gradient
all-reduces over other groups), so each step differs from the reference by float32 rounding, ~1e-7
relative, and AdamW's first updates (about lr * sign(g)) do not amplify it in 2 steps. Observed
differences are below 1e-7 relative (4e-8); rel=1e-6 leaves a 25x margin, while restarting the optimizer
from scratch on the loaded weights already changes the next loss by 4e-3 relative.
"""

from __future__ import annotations

import io
import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from distributed import RankFailure, run_distributed
from tiny_models import tiny_gpt2, tiny_llama

from engine.core.grid import init
from engine.core.linear import ParallelLinear
from engine.core.placement import local_shard
from engine.core.vocab_parallel import is_vocab_parallel
from engine.models.parallelize import parallelize
from engine.training.checkpoint import (
    METADATA_FILE,
    SHARDS_DIR,
    AsyncSaver,
    CheckpointError,
    consolidate_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from engine.training.state import full_state_dict, sync_gradients
from engine.training.train import StepLoss, TrainConfig, make_optimizer, prepare_zero, train

VOCAB, SEQ, N_EXAMPLES = 128, 12, 16
CONFIG = TrainConfig(
    epochs=2, batch_size=8, lr=1e-2, warmup_steps=1, schedule="cosine", save_every=2, progress=False
)  # 4 steps; checkpoints after steps 2 and 4
RESHARD_TOL = 1e-6  # relative, see the module doc
SAVE_GRID = {"x": 2, "y": 2}


def llama(seed: int = 0):
    return tiny_llama(vocab=VOCAB, seed=seed, heads=4, kv_heads=2, positions=32)


def examples() -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(7)
    out = []
    for _ in range(N_EXAMPLES):
        ids = torch.randint(0, VOCAB, (SEQ,), generator=gen)
        out.append({"input_ids": ids, "targets": torch.cat([ids[1:], torch.tensor([-100])])})
    return out


def gpt2(seed: int = 0):
    return tiny_gpt2(vocab=VOCAB, seed=seed)


MODELS = {"llama": llama, "gpt2": gpt2}


class _Crash(Exception):
    pass


def make_loss(crash_at_step: int | None = None):
    def loss_fn(model, batch) -> StepLoss:
        if crash_at_step is not None and int(batch["step"]) == crash_at_step:
            raise _Crash  # on every rank, before any collective of that step
        logits = model(input_ids=batch["input_ids"]).logits
        targets = batch["targets"]
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="sum")
        return StepLoss(loss_sum=loss, n_tokens=int((targets != -100).sum()))

    return loss_fn


def save_hf(grid):
    """The lead's kind of save_model: gather the full weights (collective), rank 0 writes an HF model."""

    def save(model, directory: Path, step: int | None = None) -> None:  # train() passes the step, save_checkpoint not
        state = full_state_dict(model, grid, rank0_only=True)
        if grid.rank == 0:
            plain = llama()  # the serial architecture; its weights are replaced below
            plain.load_state_dict(state)
            plain.save_pretrained(directory)

    return save


def run(
    shape: dict[str, int],
    out: Path | None,
    resume: Path | None = None,
    crash_at: int | None = None,
    seed: int = 0,
    serial_resume: bool = False,
) -> list[float]:
    """engine.training.train on a fresh tiny Llama parallelized for `shape`; the losses of the steps it ran.

    serial_resume: `resume` is a single-process run's checkpoint, whose weights the caller loads (as for a
    serial resume) before parallelizing."""
    grid = init(**shape)
    try:
        model = llama(seed)
        if serial_resume:
            from transformers import LlamaForCausalLM

            model.load_state_dict(LlamaForCausalLM.from_pretrained(resume).state_dict())
        model = parallelize(model, grid)
        try:
            result = train(
                model,
                examples(),
                make_loss(crash_at),
                CONFIG,
                out_dir=out,
                grid=grid,
                resume_from=resume,
                save_model=save_hf(grid),
            )
        except _Crash:
            return []
        return [h["loss"] for h in result.history]
    finally:
        grid.close()


def world4_runs(tmp: str) -> dict[str, list[float]]:
    root = Path(tmp)
    out = {"whole": run(SAVE_GRID, root / "whole")}
    assert run(SAVE_GRID, root / "crashed", crash_at=2) == []  # dies in step 3; the step-2 checkpoint exists
    resume = root / "crashed" / "checkpoint"
    # fresh models from another seed: every weight must come from the checkpoint
    out["same grid"] = run(SAVE_GRID, root / "resumed", resume=resume, seed=123)
    out["data=2,x=2"] = run({"data": 2, "x": 2}, None, resume=resume, seed=123)
    out["z=2,y=2"] = run({"z": 2, "y": 2}, None, resume=resume, seed=123)
    return out


def world2_runs(tmp: str) -> dict[str, list[float]]:
    resume = Path(tmp) / "crashed" / "checkpoint"
    return {
        "x=2": run({"x": 2}, None, resume=resume, seed=123),
        "data=2": run({"data": 2}, None, resume=resume, seed=123),
        "from serial, y=2": run(
            {"y": 2}, None, resume=Path(tmp) / "serial" / "checkpoint", seed=123, serial_resume=True
        ),
    }


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, dict[str, list[float]]]:
    root = tmp_path_factory.mktemp("ckpt")
    losses = run_distributed(4, world4_runs, str(root))[0]
    return root, losses


def test_resume_at_same_grid_is_exact(trained):
    root, losses = trained
    assert len(losses["whole"]) == 4
    assert losses["same grid"] == losses["whole"][2:]  # bit-exact
    assert sorted(p.name for p in root.joinpath("resumed").iterdir()) == ["checkpoint", "metrics.jsonl"]


def test_resume_at_other_grids_of_world_4(trained):
    _, losses = trained
    for name in ("data=2,x=2", "z=2,y=2"):
        assert losses[name] == pytest.approx(losses["whole"][2:], rel=RESHARD_TOL), name


def test_resume_at_world_2_and_from_a_serial_run(trained):
    root, losses = trained
    with pytest.raises(_Crash):  # a single-process run that saved at step 2, continued below at y=2
        train(
            llama(),
            examples(),
            make_loss(crash_at_step=2),
            CONFIG,
            out_dir=root / "serial",
            save_model=lambda model, directory, step: model.save_pretrained(directory),
        )
    for name, resumed in run_distributed(2, world2_runs, str(root))[0].items():
        assert resumed == pytest.approx(losses["whole"][2:], rel=RESHARD_TOL), name


def test_resume_serially_from_sharded_checkpoint(trained):
    root, losses = trained
    result = train(llama(seed=123), examples(), make_loss(), CONFIG, resume_from=root / "crashed" / "checkpoint")
    assert [h["step"] for h in result.history] == [3, 4]
    assert [h["loss"] for h in result.history] == pytest.approx(losses["whole"][2:], rel=RESHARD_TOL)


def test_consolidated_checkpoint_loads_in_plain_transformers(trained, tmp_path):
    from transformers import AutoModelForCausalLM

    root, _ = trained
    checkpoint = root / "whole" / "checkpoint"
    merged = consolidate_checkpoint(checkpoint, tmp_path / "merged")
    assert sorted(p.name for p in merged.iterdir()) == ["config.json", "model.safetensors"]
    loaded = AutoModelForCausalLM.from_pretrained(merged)
    # reference: the serial model with the full_state_dict weights that the save_model callback wrote
    reference = AutoModelForCausalLM.from_pretrained(checkpoint)
    assert loaded.state_dict().keys() == reference.state_dict().keys()
    for key, value in reference.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, reference(input_ids=ids).logits)


# ----- exact re-sharding of weights and optimizer state ----------------------------------------------------


def trained_state(make_name: str, grid, steps: int = 2):
    """A model parallelized for `grid` and its AdamW after `steps` steps (every state tensor non-trivial)."""
    model = parallelize(MODELS[make_name](0), grid)
    optimizer = make_optimizer(model, TrainConfig(lr=1e-2, weight_decay=0.1))
    for step in range(steps):
        ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(10 * grid.rank + step))
        model(input_ids=ids, labels=ids).loss.backward()
        sync_gradients(model, grid)
        optimizer.step()
        optimizer.zero_grad()
    return model, optimizer


def gathered(model, optimizer, grid) -> dict[str, torch.Tensor]:
    """Full weights and full AdamW states under serial names (collective); {} off rank 0."""
    out = {f"model/{k}": v for k, v in full_state_dict(model, grid).items()}
    modules = dict(model.named_modules())
    for name, param in model.named_parameters():
        owner, _, attr = name.rpartition(".")
        module = modules[owner]
        for key, value in optimizer.state[param].items():
            if isinstance(module, ParallelLinear) and value.dim() > 0:
                value = module.gather_weight(value) if attr == "weight" else module.gather_bias(value)
                if attr == "weight" and module.serial_layout == "conv1d":
                    value = value.t()
            elif is_vocab_parallel(module) and value.dim() > 0:  # embeddings / lm_head split by vocabulary
                value = module.gather_rows(value)
            else:  # an unsplit parameter's state: a Replicate DTensor (its step a plain tensor)
                value = local_shard(value)
            out[f"optim/{name}/{key}"] = value.clone()
    return out if grid.rank == 0 else {}


def serial_gathered(model, optimizer) -> dict[str, torch.Tensor]:
    out = {f"model/{k}": v for k, v in model.state_dict().items()}
    for name, param in model.named_parameters():
        for key, value in optimizer.state[param].items():
            out[f"optim/{name}/{key}"] = value
    return out


def save_and_reshard(tmp: str, make_name: str, save_shape: dict[str, int], load_shapes: list[dict[str, int]]):
    """Save at `save_shape` (if given), load into fresh models at each of `load_shapes`; the gathered states."""
    directory = Path(tmp) / f"roundtrip-{make_name}"
    out = {}
    if save_shape:
        with init(**save_shape) as grid:
            model, optimizer = trained_state(make_name, grid)
            out["saved"] = gathered(model, optimizer, grid)
            save_checkpoint(directory, model, optimizer, grid, extra_state={"step": 2, "rank": grid.rank})
    for shape in load_shapes:
        with init(**shape) as grid:
            model = parallelize(MODELS[make_name](seed=123), grid)
            optimizer = make_optimizer(model, TrainConfig(lr=1e-2, weight_decay=0.1))
            extra = load_checkpoint(directory, model, optimizer, grid)
            same = shape == save_shape
            assert extra == {"step": 2, "rank": grid.rank if same else 0}  # own record only at the same grid
            out[str(shape)] = gathered(model, optimizer, grid)
    return portable(out)


def portable(states: dict) -> bytes:
    """Tensors cross the process boundary by value (the result queue would share their memory otherwise)."""
    buffer = io.BytesIO()
    torch.save(states, buffer)
    return buffer.getvalue()


def unpack(data: bytes) -> dict:
    return torch.load(io.BytesIO(data), weights_only=True)


def assert_same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], label: str) -> None:
    assert a.keys() == b.keys(), label
    for key in a:
        assert torch.equal(a[key], b[key]), f"{label}: {key}"


@pytest.mark.parametrize("make_name, save_shape", [("llama", {"x": 2, "y": 2}), ("gpt2", {"z": 2, "y": 2})])
def test_resharding_is_exact(make_name, save_shape, tmp_path):
    loads = [save_shape, {"data": 2, "x": 2}, {"z": 2, "x": 2}, {"x": 4}]
    states = unpack(run_distributed(4, save_and_reshard, str(tmp_path), make_name, save_shape, loads)[0])
    assert len(states["saved"]) > 4 * 2  # weights plus exp_avg, exp_avg_sq and step of each
    for shape in loads:
        assert_same_state(states["saved"], states[str(shape)], f"{make_name} loaded at {shape}")
    at_world_2 = unpack(run_distributed(2, save_and_reshard, str(tmp_path), make_name, {}, [{"y": 2}, {"z": 2}])[0])
    for label, state in at_world_2.items():
        assert_same_state(states["saved"], state, f"{make_name} loaded at {label}")
    # into a plain serial model and optimizer, no torch.distributed
    torch.manual_seed(5)
    model = MODELS[make_name](seed=123)
    optimizer = make_optimizer(model, TrainConfig(lr=1e-2, weight_decay=0.1))
    assert load_checkpoint(tmp_path / f"roundtrip-{make_name}", model, optimizer) == {"step": 2, "rank": 0}
    assert_same_state(states["saved"], serial_gathered(model, optimizer), f"{make_name} serial")
    assert optimizer.param_groups[0]["weight_decay"] == 0.1
    # consolidation (no save_model output in this folder: config.json comes from the recorded HF config)
    from transformers import AutoModelForCausalLM

    merged = consolidate_checkpoint(tmp_path / f"roundtrip-{make_name}", tmp_path / "merged")
    plain = AutoModelForCausalLM.from_pretrained(merged)
    assert type(plain) is type(model)
    assert_same_state(
        {k: v for k, v in states["saved"].items() if k.startswith("model/")},
        {f"model/{k}": v for k, v in plain.state_dict().items()},
        f"{make_name} consolidated",
    )


def zero_roundtrip(tmp: str, stage: int) -> None:
    """GPT-2 (fused c_attn regrouped per y rank, Conv1D) trained 2 steps at data=2,y=2 with ZeRO `stage` (its weights
    or AdamW moments chunked over the data axis: the chunks cut the regrouped rows) and without ZeRO, each saved; the
    ZeRO checkpoint is also loaded at z=2,y=2 without ZeRO and saved again there."""
    for name, zero in (("zero", stage), ("plain", 0)):
        config = TrainConfig(lr=1e-2, weight_decay=0.1, zero=zero)
        with init(data=2, y=2) as grid:
            model = parallelize(gpt2(0), grid)
            prepare_zero(model, config, grid)
            optimizer = make_optimizer(model, config)
            for step in range(2):
                ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(10 * grid.rank + step))
                model(input_ids=ids, labels=ids).loss.backward()
                sync_gradients(model, grid)
                optimizer.step()
                optimizer.zero_grad()
            save_checkpoint(Path(tmp) / name, model, optimizer, grid, extra_state={"step": 2})
    with init(z=2, y=2) as grid:
        model = parallelize(gpt2(123), grid)
        optimizer = make_optimizer(model, TrainConfig(lr=1e-2, weight_decay=0.1))
        load_checkpoint(Path(tmp) / "zero", model, optimizer, grid)
        save_checkpoint(Path(tmp) / "again", model, optimizer, grid, extra_state={"step": 2})


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_chunks_of_fused_rows_reshard_exactly(tmp_path, stage):
    """The ZeRO run's state, loaded into a serial model, equals the run without ZeRO (data=2: a sum of two terms is
    the same in either order, and AdamW is elementwise, so partitioning changes no bit), and is kept exactly through a
    load and save at another grid."""
    run_distributed(4, zero_roundtrip, str(tmp_path), stage)
    states = {}
    for name in ("zero", "plain", "again"):  # each into a serial model and optimizer
        model = gpt2(seed=5)
        optimizer = make_optimizer(model, TrainConfig(lr=1e-2, weight_decay=0.1))
        load_checkpoint(tmp_path / name, model, optimizer)
        states[name] = serial_gathered(model, optimizer)
    assert len(states["zero"]) > 4 * 2 and any("c_attn" in key for key in states["zero"])
    assert_same_state(states["plain"], states["zero"], f"ZeRO {stage} vs none at data=2,y=2")
    assert_same_state(states["zero"], states["again"], f"ZeRO {stage} at data=2,y=2 -> z=2,y=2")


# ----- atomicity ------------------------------------------------------------------------------------------


def _limit_file_size(killed: bool) -> None:
    """Make this process's writes past 4 KiB fail, as on a full disk: with `killed`, SIGXFSZ ends the process in the
    middle of the write (as a node failure would); else the write fails with EFBIG (Python ignores SIGXFSZ)."""
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_DFL if killed else signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


def failing_saves(tmp: str, hard: bool, asynchronous: bool = False) -> str:
    """Save at step 1, change the weights, then a save at step 2 in which rank 1 cannot write its shard file (its
    file size limit is 4 KiB) and fails, or with `hard` is killed while writing it. `asynchronous`: the step-2 save
    is an AsyncSaver's, whose failure in the background is raised when the run waits for it."""
    directory = Path(tmp) / "atomic" / "checkpoint"
    with init(x=2) as grid:
        model, optimizer = trained_state("llama", grid, steps=1)
        if not hard:
            save_checkpoint(directory, model, optimizer, grid, extra_state={"step": 1}, save_model=save_hf(grid))
        with torch.no_grad():
            for param in model.parameters():
                param.add_(1.0)
        saver = AsyncSaver(grid) if asynchronous else None
        if grid.rank == 1:
            _limit_file_size(killed=hard)
        try:
            if saver is not None:
                saver.save(directory, model, optimizer, extra_state={"step": 2}, save_model=save_hf(grid))
                saver.close()
            else:
                save_checkpoint(directory, model, optimizer, grid, extra_state={"step": 2}, save_model=save_hf(grid))
        except CheckpointError as error:  # every rank learns of the failure: no hang
            return f"{type(error).__name__}: {error}"
        return "saved"


def check_old_checkpoint(directory: Path, staging_left: int) -> None:
    """The step-1 checkpoint is intact and loads (serially); a staging folder left by a killed save does not."""
    model = llama(seed=123)
    optimizer = make_optimizer(model, TrainConfig(lr=1e-2, weight_decay=0.1))
    assert load_checkpoint(directory, model, optimizer)["step"] == 1
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(directory)  # the save_model output is the old one too
    for key, value in hf.state_dict().items():
        assert torch.equal(value, model.state_dict()[key]), key
    staging = [p for p in directory.parent.iterdir() if p.name.startswith(".checkpoint.partial")]
    assert len(staging) == staging_left
    for folder in staging:
        with pytest.raises(CheckpointError, match="incomplete|missing"):
            load_checkpoint(folder, llama(seed=123), None)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["blocking", "async"])
def test_failed_save_keeps_previous_checkpoint(tmp_path, asynchronous):
    outcome = run_distributed(2, failing_saves, str(tmp_path), False, asynchronous)
    assert outcome[0].startswith("CheckpointError: another rank failed")
    # one line: what failed and what to fix
    assert outcome[1].startswith(f"CheckpointError: cannot write the checkpoint {tmp_path / 'atomic' / 'checkpoint'}")
    assert "File too large" in outcome[1] and "Fix: raise the file size limit" in outcome[1], outcome[1]
    assert "\n" not in outcome[1]
    check_old_checkpoint(tmp_path / "atomic" / "checkpoint", staging_left=0)  # the failed save cleaned up


def test_crash_mid_save_keeps_previous_checkpoint(tmp_path):
    run_distributed(2, failing_saves, str(tmp_path), False)  # the step-1 checkpoint (and a failed save)
    with pytest.raises(RankFailure):
        run_distributed(2, failing_saves, str(tmp_path), True, timeout=60)
    check_old_checkpoint(tmp_path / "atomic" / "checkpoint", staging_left=1)


# ----- errors ---------------------------------------------------------------------------------------------


def test_clear_errors(trained, tmp_path):
    root, _ = trained
    good = root / "crashed" / "checkpoint"
    model = llama(seed=123)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nowhere", model)
    serial = tmp_path / "serial"
    model.save_pretrained(serial)
    with pytest.raises(CheckpointError, match=f"not a sharded engine checkpoint: {METADATA_FILE} is missing"):
        load_checkpoint(serial, model)

    from transformers import LlamaConfig, LlamaForCausalLM

    other = LlamaForCausalLM(
        LlamaConfig(
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=2,
            vocab_size=VOCAB,
            intermediate_size=128,
        )
    )
    with pytest.raises(
        CheckpointError,
        match=r"another model .*different shapes model\.embed_tokens\.weight.*same "
        "config",
    ):
        load_checkpoint(good, other)
    optimizer = make_optimizer(model, TrainConfig())
    optimizer.add_param_group({"params": [torch.nn.Parameter(torch.zeros(1))]})
    with pytest.raises(CheckpointError, match="parameter groups"):
        load_checkpoint(good, model, optimizer)

    broken = tmp_path / "broken"
    shutil.copytree(good, broken)
    shard = next((broken / SHARDS_DIR).glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:200])  # truncated
    with pytest.raises(CheckpointError, match=rf"{shard.name} is truncated.*Fix: restore the shard file"):
        load_checkpoint(broken, model)
    shard.unlink()
    with pytest.raises(CheckpointError, match="incomplete"):
        load_checkpoint(broken, model)
    (broken / METADATA_FILE).write_text("{not json")
    with pytest.raises(CheckpointError, match="corrupt"):
        load_checkpoint(broken, model)
    # a checkpoint of the engine's own shard format, before DCP: refused with how to convert it
    manifest = json.loads((good / METADATA_FILE).read_text())
    (broken / METADATA_FILE).write_text(json.dumps({**manifest, "version": 2}))
    with pytest.raises(CheckpointError, match=r"version 2 engine checkpoint .*Fix: .*consolidate it into an HF folder"):
        load_checkpoint(broken, model)
    # DCP's .metadata is a pickle: one that names anything but DCP's metadata classes is refused before it runs
    (broken / METADATA_FILE).write_text(json.dumps(manifest))
    marker = tmp_path / "MARKER"
    (broken / SHARDS_DIR / ".metadata").write_bytes(pickle.dumps(_Exec(f"open({str(marker)!r}, 'w')")))
    with pytest.raises(CheckpointError, match=r"\.metadata is corrupt or not DCP metadata \(builtins\.exec is not"):
        load_checkpoint(broken, model)
    assert not marker.exists()
    # valid DCP metadata that declares an entry as bytes: DCP would torch.load(weights_only=False) its record
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    crafted = tmp_path / "crafted"
    shutil.copytree(good, crafted)
    metadata = pickle.loads((crafted / SHARDS_DIR / ".metadata").read_bytes())  # our own file: safe to read here
    key = next(iter(metadata.state_dict_metadata))
    metadata.state_dict_metadata[key] = BytesStorageMetadata()
    (crafted / SHARDS_DIR / ".metadata").write_bytes(pickle.dumps(metadata))
    with pytest.raises(CheckpointError, match=r"declares entries that are not tensors"):
        load_checkpoint(crafted, model)


class _Exec:
    """Unpickling this calls exec(code)."""

    def __init__(self, code: str) -> None:
        self.code = code

    def __reduce__(self):
        return (exec, (self.code,))


# ----- a wrapper around an HF model (a LightningModule holds it as `self.model`) -------------------------------


class _Wrapper(torch.nn.Module):
    def __init__(self, model: torch.nn.Module, extra: bool) -> None:
        super().__init__()
        self.model = model
        if extra:  # a tensor beside the HF model: an HF folder could not hold it
            self.scale = torch.nn.Parameter(torch.ones(3))


def save_wrapped(tmp: str) -> None:
    with init(x=2) as grid:
        for extra in (False, True):
            wrapper = parallelize(_Wrapper(MODELS["llama"](seed=123), extra), grid)
            save_checkpoint(Path(tmp) / f"wrapped-{extra}", wrapper, None, grid)


def test_wrapped_hf_model_consolidates_to_an_hf_folder(tmp_path):
    from transformers import AutoModelForCausalLM

    run_distributed(2, save_wrapped, str(tmp_path))
    serial = MODELS["llama"](seed=123)
    merged = consolidate_checkpoint(tmp_path / "wrapped-False", tmp_path / "merged")
    plain = AutoModelForCausalLM.from_pretrained(merged)
    assert type(plain) is type(serial)
    assert_same_state(serial.state_dict(), plain.state_dict(), "wrapped model consolidated")
    # With a tensor beside the HF model nothing is stripped or dropped: the keys keep the wrapper's names.
    beside = consolidate_checkpoint(tmp_path / "wrapped-True", tmp_path / "beside")
    from safetensors.torch import load_file

    keys = load_file(beside / "model.safetensors").keys()
    assert "scale" in keys and all(k == "scale" or k.startswith("model.") for k in keys)
    assert not (beside / "config.json").exists()
