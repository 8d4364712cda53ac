"""The training loop on a grid with a pipe axis (engine.training.train) against one process.

Each rank builds the same float64 Llama of 8 layers, engine.parallelize shards it for the grid's x/y/z (none, or
x=2 inside each stage), and train() runs 2 SGD steps of 8 sequences with gradient clipping (max norm 1.0, which
these gradients exceed: the clipped update checks the norm summed over the stages). The loss and gradient norm of
every step, the token counts and the consolidated weights after the run equal one process's.

Tolerance of gradient norms and weights: float64 (eps 1.1e-16). The pipeline runs the same operations on B/M rows
at a time and the grid sums partial gradients in another order; over 2 steps the weights move by lr * gradient, so
reordered sums bound the difference by about 1e-14 relative. 1e-10 leaves room without hiding a missing or doubled
micro-batch, stage or rank (errors of order 1 / M or more). The logged losses and the x = 2 grid have their own
tolerances below.

A run killed in the middle of an epoch resumes at the same grid, at x = 2 and at one process as the uninterrupted
run.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
from distributed import run_distributed
from tiny_models import tiny_llama

import engine
from engine.core.grid import init
from engine.training.train import StepLoss, TokenLossFn, TrainConfig, step_rows, train

VOCAB, SEQ, ROWS, LAYERS = 64, 8, 16, 8
TOLERANCE = {"rtol": 1e-10, "atol": 1e-10}  # float64, see the module docstring
# The logged losses are sums of float32 per-token losses (the chunked loss returns float32 whatever the model's
# dtype), added in another grouping by the pipeline's micro-batches: at most ROWS * SEQ = 128 terms, each addition
# off by at most float32's eps / 2 = 6e-8 relative, so 128 * 6e-8 < 1e-5 bounds the difference.
LOGGED_TOLERANCE = {"rtol": 1e-5, "atol": 0.0}
# With x = 2 inside the stages, the tensor-parallel layers add partial products in another order (float64, ~1e-16),
# and Llama's RMSNorm and rotary tables compute in float32: a float64 difference can flip a float32 rounding of a
# normalized activation (6e-8 relative), which after 2 SGD steps of lr 0.5 on gradients of order 1 moves a weight by
# at most ~1e-7 (4.6e-9 relative observed on the gradient norm). A missing or doubled micro-batch would change the
# gradient by about 1/M = 25%.
TENSOR_PARALLEL_TOLERANCE = {"rtol": 1e-6, "atol": 1e-7}


def model() -> torch.nn.Module:
    return tiny_llama(vocab=VOCAB, hidden=32, heads=4, kv_heads=2, layers=LAYERS, positions=32, dtype=torch.float64)


def examples(packed: bool = False) -> list[dict[str, torch.Tensor]]:
    """ROWS rows of SEQ random ids; `packed`: two documents per row, their position ids restarting at SEQ/2 (the
    attention then stays within each document, as --pack's rows)."""
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(0, VOCAB, (ROWS, SEQ), generator=generator)
    targets = torch.cat([ids[:, 1:], torch.full((ROWS, 1), -100)], dim=1)
    targets[::3, 2] = -100  # some ignored targets: the token count is not rows * (SEQ - 1)
    rows = [{"input_ids": ids[i], "targets": targets[i]} for i in range(ROWS)]
    if packed:
        half = torch.arange(SEQ // 2)
        for row in rows:
            row["position_ids"] = torch.cat([half, half])
            row["targets"][SEQ // 2 - 1] = -100  # no target across the documents' boundary
    return rows


def _reduce(token_losses: torch.Tensor, batch: dict[str, torch.Tensor]) -> StepLoss:
    kept = batch["targets"] != -100
    first = token_losses[:, 0].detach().sum()  # an extra quantity, logged as its mean over rows
    return StepLoss(
        loss_sum=token_losses[kept].sum(),
        n_tokens=int(kept.sum()),
        extras={"first_loss": (float(first), len(token_losses))},
    )


LOSS = TokenLossFn(targets=lambda batch: batch["targets"], reduce=_reduce)


def config(**settings) -> TrainConfig:
    base = dict(batch_size=8, lr=0.5, optimizer="sgd", max_grad_norm=1.0, progress=False, shuffle=True, seed=1)
    return TrainConfig(**{**base, **settings})


def _history(result) -> list[list[float]]:
    return [[r["loss"], r["grad_norm"], r["n_tokens"], r["first_loss"]] for r in result.history]


def serial(packed: bool, **settings) -> tuple[list[list[float]], dict[str, list]]:
    net = model()
    result = train(net, examples(packed), LOSS, config(**settings))
    return _history(result), {k: v.tolist() for k, v in net.state_dict().items()}


def parallel_worker(
    sizes: dict[str, int], settings: dict, packed: bool
) -> tuple[list[list[float]], dict[str, list] | None]:
    grid = init(**sizes)
    net = engine.parallelize(model(), grid, verify=True)  # on x = 2: a miniature checked within each stage
    result = train(net, examples(packed), LOSS, config(**settings), grid=grid)
    state = engine.full_state_dict(net, grid, rank0_only=True)
    return _history(result), ({k: v.tolist() for k, v in state.items()} if grid.rank == 0 else None)


def assert_same(expected: tuple, got: tuple, tolerance: dict) -> None:
    (history, weights), (got_history, got_weights) = expected, got
    got_history, history = torch.tensor(got_history, dtype=torch.float64), torch.tensor(history, dtype=torch.float64)
    torch.testing.assert_close(got_history[:, 1:3], history[:, 1:3], **tolerance)  # float64 norm, exact counts
    torch.testing.assert_close(got_history[:, ::3], history[:, ::3], **LOGGED_TOLERANCE)
    assert got_weights.keys() == weights.keys()
    for key in weights:
        got_weight, weight = (
            torch.tensor(got_weights[key], dtype=torch.float64),
            torch.tensor(weights[key], dtype=torch.float64),
        )
        torch.testing.assert_close(got_weight, weight, **tolerance)


@pytest.mark.parametrize(
    "sizes, settings",
    [
        ({"pipe": 2}, {"pipe_schedule": "1f1b", "grad_accum": 2, "offload_activations": True}),
        ({"pipe": 2, "data": 2}, {"pipe_schedule": "gpipe", "activation_checkpointing": True}),
        ({"pipe": 2, "x": 2}, {"pipe_schedule": "interleaved-1f1b", "pipe_virtual": 2, "microbatches": 4}),
        ({"pipe": 4}, {"pipe_schedule": "zero-bubble", "pipe_virtual": 2, "microbatches": 4}),
        ({"pipe": 2, "data": 2}, {"pipe_schedule": "1f1b", "zero": 2}),
        ({"pipe": 2, "x": 2}, {"pipe_schedule": "1f1b", "rows": "shared"}),
        ({"pipe": 2, "data": 2}, {"pipe_schedule": "1f1b", "zero": 1, "optimizer": "adamw", "lr": 1e-2}),
        ({"pipe": 2, "data": 2}, {"pipe_schedule": "interleaved-1f1b", "pipe_virtual": 2, "zero": 3}),
    ],
    ids=[
        "pipe2-1f1b-accum2-offload",
        "pipe2-data2-gpipe-checkpointing",
        "pipe2-x2-interleaved",
        "pipe4-zero-bubble",
        "pipe2-data2-zero2",
        "pipe2-x2-shared-rows",
        "pipe2-data2-zero1-adamw",
        "pipe2-data2-zero3-interleaved",
    ],
)
def test_pipelined_training_equals_one_process(sizes: dict[str, int], settings: dict) -> None:
    world = 1
    for size in sizes.values():
        world *= size
    packed = "x" in sizes or sizes["pipe"] == 4  # packed rows (own position ids) on two of the grids
    expected = serial(packed, max_steps=2, **{key: value for key, value in settings.items() if key != "zero"})
    results = run_distributed(world, parallel_worker, sizes, {"max_steps": 2, **settings}, packed)
    assert_same(expected, results[0], TENSOR_PARALLEL_TOLERANCE if "x" in sizes else TOLERANCE)
    for history, _ in results[1:]:  # every rank logs the same step records
        assert history == results[0][0]


def uneven_worker(sizes: dict[str, int] | None, settings: dict) -> tuple[list[list[float]], dict | None]:
    """12 rows in steps of 8 (each epoch ends with a step of 4), a validation loss every step."""
    grid = init(**sizes) if sizes else None
    net = engine.parallelize(model(), grid) if grid else model()
    rows = examples()
    result = train(net, rows[:12], LOSS, config(eval_every=1, **settings), grid=grid, validation=rows[12:])
    history = [[*row, record["val_loss"]] for row, record in zip(_history(result), result.history)]
    state = engine.full_state_dict(net, grid, rank0_only=True) if grid else net.state_dict()
    return history, ({k: v.tolist() for k, v in state.items()} if grid is None or grid.rank == 0 else None)


def test_shorter_last_steps_and_validation_under_zero() -> None:
    """An epoch ending with a shorter step (4 rows after 8: a second pipeline with its own micro-batch shape on the
    same stages) and a validation loss after every step (the stages run one after the other, their ZeRO roots
    gathering what model.forward could not) give one process's numbers, at pipe=2,data=2 with ZeRO 2."""
    settings = {"epochs": 2}
    expected = uneven_worker(None, settings)
    got = run_distributed(4, uneven_worker, {"pipe": 2, "data": 2}, {**settings, "zero": 2})[0]
    assert len(expected[0]) == 4
    logged = [[row[:4] for row in history] for history in (expected[0], got[0])]
    assert_same((logged[0], expected[1]), (logged[1], got[1]), TOLERANCE)
    val = torch.tensor([row[4] for row in got[0]], dtype=torch.float64)
    torch.testing.assert_close(
        val, torch.tensor([row[4] for row in expected[0]], dtype=torch.float64), **LOGGED_TOLERANCE
    )


def _held_bytes(net: torch.nn.Module) -> int:
    """The bytes of the parameters a rank holds (those not on the meta device)."""
    return sum(p.numel() * p.element_size() for p in net.parameters() if not p.is_meta)


def held_worker(sizes: dict[str, int] | None) -> dict:
    """Two SGD steps (one epoch) whose epoch-end hook computes the whole model's logits on every rank; the parameter
    bytes this rank holds after parallelizing, after the first step (train asks `stop` then), inside the hook, and
    after the run; the weights on rank 0."""
    grid = init(**sizes) if sizes else None
    net = engine.parallelize(model(), grid) if grid else model()
    built = _held_bytes(net)
    seen: dict = {}

    def on_epoch_end(whole: torch.nn.Module, epoch: int, step: int) -> None:
        ids = torch.stack([row["input_ids"] for row in examples()[:4]])
        seen.update(logits=whole(ids).logits.tolist(), held=_held_bytes(whole))

    def stop() -> bool:
        seen["stepping"] = _held_bytes(net)
        return False

    train(net, examples(), LOSS, config(epochs=1), grid=grid, on_epoch_end=on_epoch_end, stop=stop)
    state = engine.full_state_dict(net, grid, rank0_only=True) if grid else net.state_dict()
    weights = {k: v.tolist() for k, v in state.items()} if grid is None or grid.rank == 0 else None
    return {
        "built": built,
        "stepping": seen["stepping"],
        "in_hook": seen["held"],
        "trained": _held_bytes(net),
        "logits": seen["logits"],
        "weights": weights,
    }


def test_each_pipeline_rank_holds_only_its_own_stages() -> None:
    """At pipe=2 each rank holds exactly its stage's parameters while it trains and after (the other stage's on the
    meta device), measured: the split's bytes per rank (engine.training.pipeline.split_model of the serial model,
    derived here), about half of the model's each, summing to the model's. An epoch-end hook still sees the whole
    model on every rank (Pipeline.whole_model): its logits and the gathered weights equal one process's.

    Tolerance: float64, as TOLERANCE (the module docstring)."""
    from engine.training.pipeline import split_model

    stages = split_model(model(), 2)
    expected = [sum(p.numel() * p.element_size() for p in stage.parameters()) for stage in stages]
    total = sum(p.numel() * p.element_size() for p in model().parameters())
    assert sum(expected) == total and all(0.4 < share / total < 0.6 for share in expected)  # embeddings vs head
    serial_run = held_worker(None)
    results = run_distributed(2, held_worker, {"pipe": 2})
    for rank, got in enumerate(results):
        assert got["built"] == total  # every rank builds the whole model: the serial initialization
        assert got["stepping"] == got["trained"] == expected[rank], (rank, got, expected)
        assert got["in_hook"] == total
        torch.testing.assert_close(
            torch.tensor(got["logits"], dtype=torch.float64),
            torch.tensor(serial_run["logits"], dtype=torch.float64),
            **TOLERANCE,
        )
    for key, value in serial_run["weights"].items():
        torch.testing.assert_close(
            torch.tensor(results[0]["weights"][key], dtype=torch.float64),
            torch.tensor(value, dtype=torch.float64),
            **TOLERANCE,
        )


def hooked_worker(folder: str) -> bool:
    """Two epochs at pipe=2 with a checkpoint after every step and an epoch-end hook (which runs inside
    Pipeline.whole_model): whether every parameter object of the model is the one it had before training."""
    grid = init(pipe=2)
    net = engine.parallelize(model(), grid)
    before = [id(p) for p in net.parameters()]
    train(
        net,
        examples(),
        LOSS,
        config(epochs=2, save_every=1),
        grid=grid,
        out_dir=folder,
        on_epoch_end=lambda whole, epoch, step: None,
        save_model=lambda *args: None,
    )
    return [id(p) for p in net.parameters()] == before


def test_parameter_objects_survive_the_stage_moves(tmp_path) -> None:
    """Moving the other stages to the meta device and back (Pipeline.whole_model for an epoch-end hook) keeps the
    model's parameter objects, which the optimizer holds: checkpoints written after the hook find every one of them."""
    assert run_distributed(2, hooked_worker, str(tmp_path)) == [True, True]


class Killed(RuntimeError):
    """The stand-in for a kill in the middle of an epoch (raised on every rank alike: no rank is left waiting)."""


class KilledAfter(list):
    """The examples, raising Killed when a row of step `step` (1-based) is read: every rank reads the rows of every
    step it runs (all of a step's rows with data = 1), so every rank stops at the same point, after the checkpoint of
    the step before. (Row 0 is left out: every step reads it for the examples' keys.)"""

    def __init__(self, rows: list, step: int, settings: TrainConfig) -> None:
        super().__init__(rows)
        self.fatal = set(step_rows(len(rows), settings, step - 1).tolist()) - {0}

    def __getitem__(self, index):
        if index in self.fatal:
            raise Killed("killed mid-epoch")
        return super().__getitem__(index)


RESUME_SETTINGS = {"epochs": 1, "batch_size": 4, "optimizer": "adamw", "lr": 1e-2, "save_every": 1}  # 4 steps
KILLED_AT = 3  # step 3 of the epoch's 4: the run's checkpoint holds step 2


def resume_run(
    sizes: dict[str, int] | None, folder: str, kill: bool, resume: bool, zero: int = 0
) -> dict[str, list] | None:
    """Train RESUME_SETTINGS on `sizes` (None: one process) with ZeRO stage `zero`, killed mid-epoch or resumed from
    its checkpoint; the consolidated weights on rank 0."""
    grid = init(**sizes) if sizes else None
    net = engine.parallelize(model(), grid) if grid else model()
    rows = KilledAfter(examples(), KILLED_AT, config(**RESUME_SETTINGS)) if kill else examples()
    try:
        train(
            net,
            rows,
            LOSS,
            config(**RESUME_SETTINGS, zero=zero),
            grid=grid,
            out_dir=folder,
            resume_from=Path(folder) / "checkpoint" if resume else None,
            save_model=lambda m, into, step: None,  # the checkpoint's DCP shards hold the model: no HF folder here
        )
    except Killed:
        return None
    state = engine.full_state_dict(net, grid, rank0_only=True) if grid else net.state_dict()
    return {k: v.tolist() for k, v in state.items()} if grid is None or grid.rank == 0 else None


def assert_written_by_owners(checkpoint: Path) -> None:
    """Every tensor of a pipe=2 checkpoint (weights and AdamW moments) sits in a file that its stage's rank wrote
    (DCP names a rank's files __<rank>_<n>.distcp): each rank saves its own stages' tensors only."""
    import torch.distributed.checkpoint as dcp

    from engine.training.pipeline import split_model

    owner = {name: index for index, stage in enumerate(split_model(model(), 2)) for name in stage.names.values()}
    metadata = dcp.FileSystemReader(str(checkpoint / "engine_shards")).read_metadata()
    writers: dict[str, set[int]] = {}
    for index, info in metadata.storage_data.items():
        kind, _, rest = index.fqn.partition("/")
        name = rest if kind == "model" else rest.rpartition("/")[0]  # optim/<parameter>/<state key>
        writers.setdefault(name, set()).add(int(info.relative_path.split("_")[2]))
    assert set(owner) <= set(writers)
    for name, ranks in writers.items():
        assert ranks == {owner[name]}, (name, ranks)


def test_a_killed_pipelined_run_resumes_exactly_at_any_grid() -> None:
    """A pipe=2 run killed in the middle of its first epoch resumes at pipe=2, at x=2 and at one process as the
    uninterrupted run continues: AdamW's moments live on the stage that owns each parameter, and must all come back
    (its update would differ otherwise). The same with ZeRO 1 at pipe=2,data=2 (the moments also partitioned over
    data), resumed at the same grid and at data=2 without a pipeline.

    Tolerance: float64 AdamW. Its update m / (sqrt(v) + eps) moves each weight by about lr = 1e-2 whatever the
    gradient, and reordered float64 sums change m and v by ~1e-14 relative, so the weights agree to ~1e-16; the
    tolerances above hold, and a lost moment (an update of another direction and size) cannot pass them."""
    with tempfile.TemporaryDirectory() as tmp:
        uninterrupted = run_distributed(2, resume_run, {"pipe": 2}, f"{tmp}/a", False, False)[0]
        for name in ("b", "c", "d"):
            run_distributed(2, resume_run, {"pipe": 2}, f"{tmp}/{name}", True, False)
        for name in ("e", "f"):
            run_distributed(4, resume_run, {"pipe": 2, "data": 2}, f"{tmp}/{name}", True, False, 1)
        assert_written_by_owners(Path(tmp) / "b" / "checkpoint")
        resumed = {
            "pipe=2": (run_distributed(2, resume_run, {"pipe": 2}, f"{tmp}/b", False, True)[0], TOLERANCE),
            "x=2": (run_distributed(2, resume_run, {"x": 2}, f"{tmp}/c", False, True)[0], TENSOR_PARALLEL_TOLERANCE),
            "one process": (resume_run(None, f"{tmp}/d", False, True), TOLERANCE),
            "pipe=2,data=2 ZeRO 1": (
                run_distributed(4, resume_run, {"pipe": 2, "data": 2}, f"{tmp}/e", False, True, 1)[0],
                TOLERANCE,
            ),
            "data=2 ZeRO 1": (run_distributed(2, resume_run, {"data": 2}, f"{tmp}/f", False, True, 1)[0], TOLERANCE),
        }
    for where, (got, tolerance) in resumed.items():
        assert got.keys() == uninterrupted.keys(), where
        for key in uninterrupted:
            got_weight = torch.tensor(got[key], dtype=torch.float64)
            want = torch.tensor(uninterrupted[key], dtype=torch.float64)
            torch.testing.assert_close(got_weight, want, **tolerance, msg=lambda m: f"resumed at {where}, {key}: {m}")


def staged_worker(folder: str) -> dict:
    """Two interleaved-1F1B steps (V=2: two stages per rank) at pipe=2 of the model saved in `folder`, loaded twice:
    with load_sharded(pipe=...) (this rank's stages only) and whole (today's build for a folder); which tensors the
    staged load read and which parameters had storage before training, both runs' step records, and the consolidated
    weights on rank 0; the refusal of a model loaded for another cut (one stage per rank)."""
    from weight_reads import logged_weight_reads

    from engine.spec import PipeConfig

    grid = init(pipe=2)
    settings = config(max_steps=2, pipe_schedule="interleaved-1f1b", pipe_virtual=2, microbatches=4)
    out: dict = {}
    for kind, pipe in (("staged", settings.pipe_config), ("whole", None)):
        with logged_weight_reads() as read:
            net = engine.load_sharded(folder, grid, dtype=torch.float64, pipe=pipe)
        held = sorted(name for name, p in net.named_parameters() if not p.is_meta)
        buffers = {name: b.tolist() for name, b in net.named_buffers()}
        result = train(net, examples(), LOSS, settings, grid=grid)
        state = engine.full_state_dict(net, grid, rank0_only=True)
        weights = {k: v.tolist() for k, v in state.items()} if grid.rank == 0 else None
        out[kind] = {"read": sorted(read), "held": held, "buffers": buffers, "history": _history(result)}
        out[kind]["weights"] = weights
    other_cut = engine.load_sharded(folder, grid, dtype=torch.float64, pipe=PipeConfig())  # one stage per rank
    with pytest.raises(ValueError, match="holds parameters on the meta device") as refused:
        train(other_cut, examples(), LOSS, settings, grid=grid)
    out["refused"] = str(refused.value)
    return out


def test_a_pipe_rank_loads_only_its_own_stages_and_trains_as_the_whole_model(tmp_path) -> None:
    """engine.load_sharded(folder, grid, pipe=...) at pipe=2 with two stages per rank: each rank reads exactly its
    own stages' tensors (each once; the ranks together the whole model) and holds nothing else before the Pipeline is
    built, its rotary tables equal the serial model's, and two steps give the losses, gradient norms and weights of
    the whole-model load bit for bit (the same operations on the same values). A model loaded for another cut is
    refused by the Pipeline in one line."""
    from engine.training.pipeline import split_model

    serial = model()
    serial.save_pretrained(tmp_path, safe_serialization=True)
    stages = split_model(model(), 4)
    owned = [sorted(name for stage in stages[rank::2] for name in stage.names.values()) for rank in range(2)]
    results = run_distributed(2, staged_worker, str(tmp_path))
    assert sorted(owned[0] + owned[1]) == sorted(dict(serial.named_parameters()))
    expected_buffers = {name: b.tolist() for name, b in serial.named_buffers()}
    for rank, got in enumerate(results):
        staged, whole = got["staged"], got["whole"]
        assert staged["read"] == staged["held"] == owned[rank], rank
        assert whole["read"] == whole["held"] == sorted(dict(serial.named_parameters())), rank
        assert staged["buffers"] == whole["buffers"] == expected_buffers, rank
        assert staged["history"] == whole["history"], rank
        assert got["refused"].count("\n") == 0 and "loaded for another cut" in got["refused"], rank
    assert results[0]["staged"]["weights"] == results[0]["whole"]["weights"]
