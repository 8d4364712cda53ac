"""Sharding verification: before a model is sharded, a miniature of its class runs sharded on the real grid and
serially on every rank, and the sharding is refused when the two disagree.

    model = engine.parallelize(model, grid, verify=True)    # ShardingError naming what differs, or the model sharded

The engine shards a family through its declared tensor-parallel plan and refuses what it cannot map
(engine/models/adapter.py), but a plan says which Linears to split, not everything a family does between them (a
fused projection's feature order, a module outside the layers that the layers read). The miniature
(engine/models/miniature.py: the same class and settings, two layers, narrow, float64, every weight perturbed so that
zero biases and unit norms cannot hide a wrong term) is the family's actual code run both ways on a few rows: the
summed token loss and every parameter's gradient must agree. It costs a second or two on a CPU and runs once per
parallelize call, before the real model is touched.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from conventions import IGNORE_INDEX
from engine.core import comm
from engine.core.grid import Grid
from engine.core.linear import ShardingError
from engine.models.adapter import Families
from engine.models.miniature import miniature_config, parameter_count
from engine.models.parallelize import parallelize as _shard
from engine.spec import AXES, GRID_AXES
from engine.training.state import full_state_dict, sync_gradients

ROWS_PER_RANK = 2  # rows of the verification batch each rank runs (the serial side runs all of them)
TOKENS = 8  # tokens per row
PERTURBATION = 0.05  # standard deviation of the noise added to every weight of the miniature
# Relative to a tensor's largest gradient (and for the loss, to the loss). In float64 several families still compute
# norms and rotary tables in float32 (relative rounding ~6e-8) and the sharded side sums products in another order:
# differences stay below ~1e-6, and 1e-4 leaves two orders of margin on any CPU or thread count. Families whose
# kernels run only in float32 (~1e-7 per rounding, accumulated over two layers and a few hundred-term sums: ~1e-5)
# get 1e-3. Either still catches a wrong or missing term, which moves a gradient by a sizeable fraction of its largest
# entry (a head of the wrong shard: O(1)).
TOLERANCES = {torch.float64: 1e-4, torch.float32: 1e-3}
MAX_PARAMETERS = 50_000_000  # a miniature larger than this is not built (seconds on a CPU, not minutes)


@dataclass(frozen=True)
class Verification:
    """What a passed verification ran: the `family` (config.model_type), the miniature's `parameters` (elements),
    and the wall time in `seconds` on this rank."""

    family: str
    parameters: int
    seconds: float


def _transformers_model(model: nn.Module) -> nn.Module | None:
    """The outermost transformers model inside `model` (itself, or e.g. inside a Lightning module), or None."""
    for module in model.modules():
        if hasattr(module, "config") and hasattr(module, "get_input_embeddings") and hasattr(module.config, "to_dict"):
            return module
    return None


def _batch(vocab: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`rows` rows of TOKENS random ids and an attention mask with right padding on some rows (same on every rank)."""
    generator = torch.Generator().manual_seed(11)
    ids = torch.randint(0, vocab, (rows, TOKENS), generator=generator)
    lengths = torch.randint(TOKENS // 2, TOKENS + 1, (rows,), generator=generator)
    return ids, (torch.arange(TOKENS)[None, :] < lengths[:, None]).long()


def _summed_loss(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids, attention_mask=mask).logits
    targets = ids[:, 1:].masked_fill(mask[:, 1:] == 0, IGNORE_INDEX)
    return F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).double(), targets.reshape(-1).to(logits.device), reduction="sum"
    )


def _build_miniature(hf_model: nn.Module, shards: int, device: torch.device, dtype: torch.dtype) -> nn.Module:
    config = miniature_config(hf_model.config, shards=shards)
    with torch.device("meta"):  # a shrinker that missed a width must not allocate a real-size model
        meta = type(hf_model)(config)
    size = parameter_count(meta) + sum(buffer.numel() for buffer in meta.buffers())
    if size > MAX_PARAMETERS:
        raise ValueError(f"its miniature would still hold {size / 1e6:.0f}M parameter and buffer elements")
    with torch.random.fork_rng(devices=[]):  # the caller's random stream (data order, dropout) stays untouched
        torch.manual_seed(0)
        mini = type(hf_model)(config).to(device=device, dtype=dtype)
        generator = torch.Generator(device="cpu").manual_seed(1)
        with torch.no_grad():
            for param in mini.parameters():
                noise = torch.randn(param.shape, generator=generator, dtype=dtype)
                param.add_(PERTURBATION * noise.to(param.device))
    for module in mini.modules():  # dropout off on both sides: the comparison must not depend on random masks
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    return mini.train()


def _run_serial(
    hf_model: nn.Module, grid: Grid, family: str, overlap: bool, vocab_parallel: bool | None, families: Families
) -> tuple:
    """The miniature (serial, and a copy sharded on `grid`), the batch, the serial summed loss and gradients, and the
    tolerance of the dtype it ran in. A refusal of the static plan (ShardingError) comes first, exactly as the real
    model would get it; float32 is tried when the family's kernels do not run in float64 (grouped expert matmuls)."""
    errors = []
    for dtype in (torch.float64, torch.float32):
        try:
            serial = _build_miniature(hf_model, grid.size("x", "y", "z"), grid.device, dtype)
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(f"{type(error).__name__}: {error}")
            continue
        # A ShardingError here is the static plan's refusal, the line the real model would get.
        sharded = _shard(copy.deepcopy(serial), grid, overlap=overlap, vocab_parallel=vocab_parallel, families=families)
        vocab = serial.get_input_embeddings().weight.shape[0]
        ids, mask = _batch(vocab, grid.size(*AXES) * ROWS_PER_RANK)  # every pipeline stage checks on its own
        ids, mask = ids.to(grid.device), mask.to(grid.device)
        try:
            loss = _summed_loss(serial, ids, mask)
            loss.backward()
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(f"{type(error).__name__}: {error}")
            continue
        reference = {name: param.grad for name, param in serial.named_parameters() if param.grad is not None}
        return serial, sharded, ids, mask, loss.item(), reference, TOLERANCES[dtype]
    raise ShardingError(
        f"{family}: no miniature of {type(hf_model).__name__} could be built and run to verify its sharding "
        f"({errors[-1][:300]}); train on a grid without x, y and z, or skip the check (verify=False, --no-verify) "
        "at your own risk"
    )


def _differences(ours: dict[str, torch.Tensor], reference: dict[str, torch.Tensor], tolerance: float) -> list[str]:
    """Names of the tensors (with their relative error) where `ours` and `reference` disagree."""
    out = []
    for key, expected in reference.items():
        got = ours.get(key)
        if got is None or got.shape != expected.shape:
            out.append(f"{key} (missing or of another shape)")
            continue
        got, expected = got.double().cpu(), expected.double().cpu()
        if not torch.isfinite(got).all():
            out.append(f"{key} (not finite)")
            continue
        scale = expected.abs().max().item()
        error = (got - expected).abs().max().item()
        if error > tolerance * max(scale, 1e-12):
            out.append(f"{key} (off by {error / max(scale, 1e-12):.2g} of its largest value)")
    return out


def verify_sharding(
    model: nn.Module,
    grid: Grid,
    *,
    overlap: bool = True,
    vocab_parallel: bool | None = None,
    families: Families = None,
) -> Verification | None:
    """Shard a miniature of `model`'s class on `grid` as parallelize would (with the family adapters `families`, None:
    the known ones) and compare it with the serial miniature.

    Collective: every rank of the grid must call it. Returns None when there is nothing to verify (no tensor
    parallelism, nothing sharded); raises ShardingError naming the family and the first differences when the sharded
    loss or gradients differ from one process's, or when no miniature of the class can be built or run.
    """
    if grid.size("x", "y", "z") == 1:
        return None
    hf_model = _transformers_model(model)
    if hf_model is None:
        return None  # not a transformers model: parallelize plans none of it, and refuses on a tensor-parallel grid
    family = getattr(hf_model.config, "model_type", type(hf_model).__name__)
    start = time.perf_counter()
    built = _run_serial(hf_model, grid, family, overlap, vocab_parallel, families)
    serial, sharded, ids, mask, reference_loss, reference, tolerance = built
    parameters = parameter_count(serial)
    del serial
    failure: str | None = None
    try:
        rank = grid.group(*AXES).rank  # within this pipeline stage
        mine = slice(rank * ROWS_PER_RANK, (rank + 1) * ROWS_PER_RANK)
        loss = _summed_loss(sharded, ids[mine], mask[mine])
        loss.backward()
        sync_gradients(sharded, grid)
        total = comm.all_reduce(loss.detach().reshape(1), grid.group(*AXES)).item()
        # The full gradients: written into the weights, which full_state_dict gathers as the serial model names them.
        with torch.no_grad():
            for param in sharded.parameters():
                param.copy_(torch.zeros_like(param) if param.grad is None else param.grad)
        gradients = full_state_dict(sharded, grid)
    except ShardingError as error:
        failure = str(error)
        gradients, total = {}, float("nan")
    except Exception as error:  # noqa: BLE001 - reported as a refusal naming the family
        failure = f"sharded raised {type(error).__name__}: {error}"
        gradients, total = {}, float("nan")
    if failure is None:
        differences = _differences(gradients, reference, tolerance)
        if not (abs(total - reference_loss) <= tolerance * abs(reference_loss)):
            differences.insert(0, f"the summed loss ({total:.10g} against {reference_loss:.10g})")
        if differences:
            shown = ", ".join(differences[:4]) + (f" and {len(differences) - 4} more" if len(differences) > 4 else "")
            failure = f"sharded differs from one process in {shown}"
    agreed = comm.all_agree(failure is None, grid.group(*GRID_AXES), grid.device)
    if not agreed:
        shape = ",".join(f"{axis}={grid.size(axis)}" for axis in AXES if grid.size(axis) > 1)
        raise ShardingError(
            f"{family}: the engine cannot shard {type(hf_model).__name__} correctly on grid {shape}: a miniature "
            f"{failure or 'failed on another rank'}; train on a grid without x, y and z (data parallelism, "
            "optionally with ZeRO)"
        )
    return Verification(family, parameters, time.perf_counter() - start)


def parallelize(
    model: nn.Module,
    grid: Grid,
    *,
    overlap: bool = True,
    vocab_parallel: bool | None = None,
    verify: bool = False,
    report: Any = None,
    families: Families = None,
) -> nn.Module:
    """engine.parallelize: shard `model` in place for `grid` (engine.models.parallelize.parallelize), after verifying
    the sharding of its class on a miniature when `verify` (verify_sharding; collective). `report`, if given, is
    called with the Verification (e.g. to print its cost). `families`: the family adapters (engine/models/family.py)
    to look the model's family up in, None for the known ones. Raises ShardingError as both do."""
    if verify:
        result = verify_sharding(model, grid, overlap=overlap, vocab_parallel=vocab_parallel, families=families)
        if result is not None and report is not None:
            report(result)
    return _shard(model, grid, overlap=overlap, vocab_parallel=vocab_parallel, families=families)
