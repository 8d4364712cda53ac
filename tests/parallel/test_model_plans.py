"""Models sharded through their declared tensor-parallel plans (engine/models/adapter.py), against the serial model.

For every family in tiny_models.PLANNED_FAMILIES and every grid below: the parallelized copy of a tiny random-init
model gives the serial model's summed token loss over the global batch, its gradients (after sync_gradients), and
the same weights after one SGD step. Models run in float64, but several families compute their norms in float32
(LlamaRMSNorm, Olmo2RMSNorm, ...), so both sides carry float32 rounding (~6e-8 relative) and the parallel one sums
some products in other orders (over y for OLMo2's q/k norms, over x for every sharded product): the differences stay
below ~1e-6 relative. rtol=atol=1e-5 leaves margin on any CPU and thread count and still catches a wrong or missing
term (a dropped multiplier or a head of the wrong shard moves gradients by O(1e-2) or more).
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from distributed import run_distributed
from tiny_models import MOE_FAMILIES, PLANNED_FAMILIES, tiny_family

from engine.core import comm
from engine.core.grid import AXES, init
from engine.core.linear import ParallelLinear, ShardingError
from engine.core.placement import local_shard
from engine.core.vocab_parallel import is_vocab_parallel
from engine.models.adapter import check_supported, model_plan
from engine.models.parallelize import parallelize
from engine.training.state import full_state_dict, sync_gradients

TOL = {"rtol": 1e-5, "atol": 1e-5}
ROWS, SEQ, VOCAB, LR = 2, 8, 64, 0.1
WORLD2_GRIDS = [(1, 2, 1, 1), (1, 1, 2, 1), (1, 1, 1, 2)]  # (data, x, y, z): x=2, y=2, z=2
WORLD4_GRIDS = [(2, 2, 1, 1), (1, 2, 2, 1)]  # data=2,x=2 and x=2,y=2
CLI_FAMILIES = ("llama", "gpt_neox", "olmo2", "gemma2", "phi3", "cohere", "granite")  # ~50 s each on 2 cores


def make(family: str) -> torch.nn.Module:
    return tiny_family(family, vocab=VOCAB, dtype=torch.float64)


def batch(world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Global batch of world*ROWS rows: token ids and an attention mask with right padding on some rows."""
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(0, VOCAB, (world * ROWS, SEQ), generator=gen)
    lengths = torch.randint(SEQ // 2, SEQ + 1, (world * ROWS,), generator=gen)
    return ids, (torch.arange(SEQ)[None, :] < lengths[:, None]).long()


def loss_sum(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids, attention_mask=mask).logits
    targets = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
    return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB).float().double(), targets.reshape(-1), reduction="sum")


def full_grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's gradient as the serial model names and shapes it (collective)."""
    modules = dict(model.named_modules())
    out = {}
    for name, param in model.named_parameters():
        owner, _, attr = name.rpartition(".")
        module, grad = modules[owner], param.grad
        if isinstance(module, ParallelLinear):
            grad = module.gather_weight(grad) if attr == "weight" else module.gather_bias(grad)
            if attr == "weight" and module.serial_layout == "conv1d":
                grad = grad.t()
        elif is_vocab_parallel(module):
            grad = module.gather_rows(grad)
        else:  # an unsplit parameter: a Replicate DTensor, its gradient too
            grad = local_shard(grad)
        out[name] = grad
    return out


def serial(family: str, world: int) -> dict:
    """The serial model's loss, gradients and weights after one SGD step on the global batch."""
    model = make(family)
    ids, mask = batch(world)
    loss = loss_sum(model, ids, mask)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    torch.optim.SGD(model.parameters(), lr=LR).step()
    return {"loss": loss.item(), "grads": grads, "stepped": {k: v.clone() for k, v in model.state_dict().items()}}


def check(family: str, shape: tuple[int, int, int, int], ref: dict) -> None:
    data, x, y, z = shape
    grid = init(data=data, x=x, y=y, z=z)
    try:
        model = parallelize(copy.deepcopy(make(family)), grid)
        mine = slice(grid.rank * ROWS, (grid.rank + 1) * ROWS)
        ids, mask = batch(grid.world_size)
        loss = loss_sum(model, ids[mine], mask[mine])
        loss.backward()
        sync_gradients(model, grid)
        total = comm.all_reduce(loss.detach().reshape(1), grid.group(*AXES)).item()
        assert total == pytest.approx(ref["loss"], rel=1e-9, abs=0), f"summed loss {total} != {ref['loss']}"
        grads = full_grads(model)
        assert grads.keys() == ref["grads"].keys()
        for name, grad in ref["grads"].items():
            torch.testing.assert_close(grads[name], grad, **TOL, msg=lambda m, n=name: f"grad {n}: {m}")
        torch.optim.SGD(model.parameters(), lr=LR).step()
        state = full_state_dict(model, grid)
        assert state.keys() == ref["stepped"].keys()
        for key, value in ref["stepped"].items():
            torch.testing.assert_close(state[key], value, **TOL, msg=lambda m, k=key: f"after SGD {k}: {m}")
    except AssertionError as error:
        raise AssertionError(f"{family} on grid data={data} x={x} y={y} z={z}: {error}") from error
    finally:
        grid.close()


def _worker(world: int, shapes: list, families: tuple[str, ...]) -> list[str]:
    refs = {family: serial(family, world) for family in families}  # on every rank: tensors do not cross processes
    done, failed = [], []
    for shape in shapes:
        for family in families:
            try:  # every family on every grid, so that a failure names all the others that fail too
                check(family, shape, refs[family])
                done.append(f"{family}{shape}")
            except Exception as error:  # noqa: BLE001 - collected and raised below
                failed.append(f"{type(error).__name__}: {error}")
    if failed:
        raise AssertionError("\n".join(failed))
    return done


def run(world: int, shapes: list, families: tuple[str, ...] = PLANNED_FAMILIES) -> None:
    results = run_distributed(world, _worker, world, shapes, families, timeout=600.0)
    assert results == [[f"{f}{s}" for s in shapes for f in families]] * world


def test_issue_families_on_world_2_grids() -> None:
    run(2, WORLD2_GRIDS, CLI_FAMILIES)


def test_issue_families_on_world_4_grids() -> None:
    run(4, WORLD4_GRIDS, CLI_FAMILIES)


@pytest.mark.slow
def test_other_planned_families_on_every_grid() -> None:
    others = tuple(f for f in PLANNED_FAMILIES if f not in CLI_FAMILIES)
    run(2, WORLD2_GRIDS, others)
    run(4, WORLD4_GRIDS, others)


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_mixture_of_experts_is_refused_with_tensor_parallelism(family: str) -> None:
    """MoE families declare their experts as fused 3-D parameters (packed_colwise, moe_tp_experts): one line names
    the family and the fix; a grid without tensor parallelism is not refused."""
    plan = model_plan(make(family).model)
    assert plan is not None and plan.unsupported
    with pytest.raises(ShardingError, match=f"^{family}: .*mixture-of-experts.*use a grid without x, y and z"):
        check_supported(plan, tensor_parallel=True)
    check_supported(plan, tensor_parallel=False)


@pytest.mark.slow
@pytest.mark.parametrize("family", CLI_FAMILIES)
def test_goldfish_train_on_a_tensor_parallel_grid(family: str, tmp_path) -> None:
    """`goldfish train --nproc 2 --grid x=2 --model <folder>` on a tiny saved model of `family` gives the losses of
    the single-process run, and its checkpoint loads in plain transformers with the single-process run's weights.
    SGD (the update is lr x gradient) keeps the two runs' weights within float32 rounding of each other: the
    parallel products sum in another order (~1e-7 relative per step), so rtol=atol=1e-4 after a few steps leaves
    margin and still catches a wrong gradient (O(lr x gradient) = O(1e-2) off)."""
    from transformers import AutoModelForCausalLM

    from data.documents import default_corpus
    from data.tokenizer import train_bpe_tokenizer
    from goldfish.app.cli import main

    tokenizer = train_bpe_tokenizer((d.text for d in default_corpus()), vocab_size=400)
    folder = tmp_path / "model"
    tiny_family(family, vocab=len(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    common = [
        "--model",
        str(folder),
        "--strategy",
        "hashed",
        "--n-train",
        "4",
        "--n-heldout",
        "2",
        "--seq-len",
        "32",
        "--epochs",
        "2",
        "--batch-size",
        "2",
        "--optimizer",
        "sgd",
        "--lr",
        "0.1",
        "--no-progress",
    ]
    parallel, serial = tmp_path / "parallel", tmp_path / "serial"
    result = subprocess.run(
        [sys.executable, "-m", "goldfish", "train", "--nproc", "2", "--grid", "x=2", "--out", str(parallel), *common],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert main(["train", "--out", str(serial), *common]) == 0
    losses = [
        [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]
        for run in (parallel, serial)
    ]
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    ours, reference = [
        AutoModelForCausalLM.from_pretrained(run / "checkpoint").state_dict() for run in (parallel, serial)
    ]
    assert ours.keys() == reference.keys()
    for key, value in reference.items():
        torch.testing.assert_close(ours[key], value, rtol=1e-4, atol=1e-4, msg=lambda m, k=key: f"{k}: {m}")


@pytest.mark.parametrize("family", ["llama", "gpt_neox", "gemma2", "cohere", "granite"])
def test_token_losses_follow_the_models_own_logits(family: str) -> None:
    """causal_lm_token_losses equals cross-entropy of model(...).logits for a plain head (computed from the hidden
    states) and for families that transform their logits after the head (soft-capping, logit scales: recognised and
    computed from the logits). The losses come back in float32 (~6e-8 relative rounding of values ~4): 1e-6."""
    from engine.core.vocab_parallel import causal_lm_token_losses

    model = make(family)
    ids, mask = batch(1)
    targets = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
    logits = model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1]).logits
    expected = F.cross_entropy(logits.flatten(0, 1), targets.reshape(-1), reduction="none").reshape(targets.shape)
    for _ in range(2):  # the second call takes the path the first one chose
        losses = causal_lm_token_losses(model, ids[:, :-1], targets, attention_mask=mask[:, :-1])
        torch.testing.assert_close(losses.double(), expected, rtol=1e-6, atol=1e-6)
    transformed = model.get_output_embeddings().transforms_logits
    assert transformed == (family in ("gemma2", "cohere", "granite"))
