"""torch's own optimizers, clipping, GradScaler and DCP on a data=2,x=2 tiny Llama whose parameters are all DTensors.

Every split tensor (projections, vocabulary tables) is a DTensor sharded on Grid.device_mesh(); every unsplit one
(norms) a Replicate DTensor on the same mesh, which its module computes on as a local tensor for the duration of its
forward (engine.core.placement.LocalDuringForward). Everything torch takes the parameters in one call of then
composes with the model unchanged (docs/engine.md, "Python API"):

    torch.optim.AdamW / SGD, one tensor at a time, foreach and fused     equal one process
    torch.nn.utils.clip_grad_norm_ (the norm of the full model)          equals one process
    torch.amp.GradScaler's unscale_, parameters_to_vector                run
    dcp.save(model.state_dict()) / dcp.load(model.state_dict())          unchanged, at the same grid

Tolerances. The model is float64, but Llama's RMSNorm normalizes in float32, so sums taken in another order on the
grid reach the gradients as float32 roundings: clipped norms and losses agree to ~1e-8 relative (measured at most
1.3e-8 and 1.0e-9: bound 1e-6), SGD's weights, which follow the gradients linearly, to 1e-8 (measured 1.4e-10).
AdamW's update lr * m / (sqrt(v) + eps) moves a weight by about lr per step whatever the gradient's scale, so it
turns a rounding of a gradient element near zero into a visible change: its weights are held to 1e-3 of the
distance STEPS steps can move them, STEPS * LR * 1e-3 (measured 1.7e-6 = 4e-5 of it), while a gradient summed over
the wrong axes points elsewhere and moves weights apart by about LR per step. torch's clip_grad_norm_ and
engine.clip_grad_norm_ take the same norm on the grid (measured 2.2e-16 relative apart).
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
import torch.nn.functional as F
from distributed import run_distributed
from tiny_models import tiny_llama

from engine.core.grid import init
from engine.core.placement import is_placed
from engine.models.parallelize import parallelize
from engine.training.state import clip_grad_norm_, full_state_dict, sync_gradients

ROWS, SEQ, VOCAB = 2, 8, 128
STEPS, LR, MAX_NORM = 4, 1e-2, 1.0
OPTIMIZERS = {
    "SGD": lambda params: torch.optim.SGD(params, lr=LR, momentum=0.9, foreach=False),
    "SGD foreach": lambda params: torch.optim.SGD(params, lr=LR, momentum=0.9, foreach=True),
    "AdamW": lambda params: torch.optim.AdamW(params, lr=LR, foreach=False),
    "AdamW foreach": lambda params: torch.optim.AdamW(params, lr=LR, foreach=True),
    "AdamW fused": lambda params: torch.optim.AdamW(params, lr=LR, fused=True),
}
SERIAL = {name: "SGD" if "SGD" in name else "AdamW" for name in OPTIMIZERS}
WEIGHT_TOL = {"SGD": 1e-8, "AdamW": STEPS * LR * 1e-3}
REL_TOL = 1e-6  # losses and clipped norms


def _model() -> torch.nn.Module:
    return tiny_llama(vocab=VOCAB, dtype=torch.float64)


def _batch(world: int, step: int) -> torch.Tensor:
    """The global batch of `step`: world * ROWS rows of SEQ token ids."""
    return torch.randint(0, VOCAB, (world * ROWS, SEQ), generator=torch.Generator().manual_seed(200 + step))


def _loss_sum(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids).logits
    return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1), reduction="sum")


def _serial(world: int) -> dict[str, dict]:
    """Per optimizer kind: the losses, clipped norms and final state of STEPS steps of one process (torch's clip)."""
    out = {}
    for kind, build in (("SGD", OPTIMIZERS["SGD"]), ("AdamW", OPTIMIZERS["AdamW"])):
        model = _model()
        optimizer = build(model.parameters())
        losses, norms = [], []
        for step in range(STEPS):
            loss = _loss_sum(model, _batch(world, step))
            loss.backward()
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM).item())
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        out[kind] = {"losses": losses, "norms": norms, "state": {k: v.clone() for k, v in model.state_dict().items()}}
    return out


def _refusal(call) -> str:
    """An empty string when `call` runs, else its error (torch refused a list mixing DTensors and plain tensors
    before every parameter was placed: "mixed torch.Tensor and DTensor")."""
    try:
        call()
    except RuntimeError as error:
        return str(error)
    return ""


def _differences(run: dict, expected: dict) -> dict[str, float]:
    """The largest relative differences of losses and clipped norms, and absolute of final weights, from one process."""
    return {
        "losses": max(abs(a / b - 1) for a, b in zip(run["losses"], expected["losses"])),
        "norms": max(abs(a / b - 1) for a, b in zip(run["norms"], expected["norms"])),
        "weights": max(float((run["state"][key] - value).abs().max()) for key, value in expected["state"].items()),
    }


def _worker(directory: str, reference: dict[str, dict]) -> dict:
    grid = init(data=2, x=2)
    serial = _model()
    mine = slice(grid.rank * ROWS, (grid.rank + 1) * ROWS)
    out: dict = {"runs": {}, "refused": {}}
    for name, build in OPTIMIZERS.items():
        model = parallelize(copy.deepcopy(serial), grid)
        optimizer = build(model.parameters())
        losses, norms, engine_norms = [], [], []
        for step in range(STEPS):
            loss = _loss_sum(model, _batch(grid.world_size, step)[mine])
            loss.backward()
            sync_gradients(model, grid)
            if step == 0 and name == "AdamW":  # torch's tools that take every parameter at once
                params = list(model.parameters())
                out["split"] = {"placed": sum(map(is_placed, params)), "plain": sum(not is_placed(p) for p in params)}
                out["refused"] = {
                    "GradScaler": _refusal(lambda: _unscale(_copies(params))),
                    "parameters_to_vector": _refusal(lambda: torch.nn.utils.parameters_to_vector(params)),
                }
            engine_norms.append(clip_grad_norm_(model, float("inf"), grid).item())  # measures only
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM).full_tensor()))
            optimizer.step()
            optimizer.zero_grad()
            total = loss.detach().reshape(1)
            torch.distributed.all_reduce(total)
            losses.append(total.item())
        run = {"losses": losses, "norms": norms, "state": full_state_dict(model, grid)}
        out["runs"][name] = _differences(run, reference[SERIAL[name]])
        out["runs"][name]["engine norms"] = max(abs(a / b - 1) for a, b in zip(engine_norms, norms))
    # torch's DCP on the model's own state dict: written by the last run, read into a fresh model at the same grid
    import torch.distributed.checkpoint as dcp

    dcp.save(model.state_dict(), checkpoint_id=directory)
    fresh = parallelize(tiny_llama(vocab=VOCAB, dtype=torch.float64, seed=1), grid)
    state = fresh.state_dict()
    dcp.load(state, checkpoint_id=directory)
    loaded = full_state_dict(fresh, grid)
    out["dcp"] = {key: torch.equal(value, loaded[key]) for key, value in full_state_dict(model, grid).items()}
    grid.close()
    return out


def _unscale(params: list[torch.nn.Parameter]) -> None:
    """torch.amp.GradScaler's unscale_ of an optimizer over `params` (its inf/NaN check runs on all of them at once)."""
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(torch.ones(()))
    scaler.unscale_(torch.optim.SGD(params, lr=LR))


def _copies(params: list[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
    """Copies of `params` with copies of their gradients (what torch's tools are tried on, the model untouched)."""
    copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for copied, param in zip(copies, params):
        copied.grad = param.grad.clone()
    return copies


def test_torch_tools_on_placed_tensors(tmp_path: Path) -> None:
    """Every parameter is placed; torch's optimizers (one tensor at a time, foreach and fused) with its
    clip_grad_norm_ equal one process, and so does the engine's clip_grad_norm_; GradScaler's unscale_
    and parameters_to_vector run; DCP saves and loads the model's own state dict."""
    results = run_distributed(4, _worker, str(tmp_path / "dcp"), _serial(4))
    for result in results:
        assert result["split"]["placed"] > 0 and result["split"]["plain"] == 0, result["split"]
        for what, message in result["refused"].items():
            assert not message, f"torch's {what} refuses the model: {message}"
        for name, differences in result["runs"].items():
            assert differences["losses"] < REL_TOL and differences["norms"] < REL_TOL, (name, differences)
            assert differences["engine norms"] < REL_TOL, (name, differences)
            assert differences["weights"] < WEIGHT_TOL[SERIAL[name]], (name, differences)
        assert all(result["dcp"].values()), [k for k, ok in result["dcp"].items() if not ok]
