"""The declared layout (engine/models/layout.py) against the model it describes, on 4 gloo ranks.

For every state-dict tensor of a parallelized model, each rank's pieces must cut exactly its local tensor out of the
serial model's tensor, the ranks' pieces together must cover the full tensor, and a DTensor on Grid.device_mesh()
built from the local tensor with the layout's placements must gather to the serial tensor. Fused projections
(GPT-2's c_attn, Phi-3's qkv_proj and gate_up_proj) and vocabulary-parallel tables are covered on grids with y = 2:
every parameter is a placed DTensor (an unsplit one Replicate on every axis), a fused one of its stored (regrouped)
rows, a vocabulary table split over two axes (x*y, y*z) with Shard(0) on both.
"""

from __future__ import annotations

import copy

import pytest
import torch
from distributed import run_distributed

from engine.core.grid import init
from engine.core.placement import is_placed
from engine.models.layout import plan_of
from engine.models.miniature import miniature_config
from engine.models.parallelize import parallelize

FAMILIES = ("llama", "gpt2", "phi3")
GRIDS = ({"x": 2, "y": 2}, {"y": 2, "z": 2}, {"data": 2, "x": 2}, {"pipe": 2, "x": 2})


def _serial(model_type: str) -> torch.nn.Module:
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = miniature_config(CONFIG_MAPPING[model_type](), shards=4)
    torch.manual_seed(0)
    return getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])(config)


def _check(model_type: str, sizes: dict[str, int]) -> dict:
    from torch.distributed.tensor import DTensor

    serial = _serial(model_type)
    reference = {k: v.detach().clone() for k, v in serial.state_dict().items()}
    grid = init(**sizes)
    model = parallelize(copy.deepcopy(serial), grid)
    layout = plan_of(model, grid)
    mesh = grid.device_mesh()
    covered, placed, fused_placed = {}, 0, 0
    for p in layout.params.values():
        full = reference[p.key].t() if p.serial_transposed else reference[p.key]
        assert tuple(full.shape) == p.full_shape, p.key
        local = p.local.detach()
        assert isinstance(p.tensor, DTensor) == (is_placed(p.tensor) and "zero" not in sizes), p.key
        assert tuple(local.shape) == p.local_shape(), p.key
        assert torch.equal(p.take_local(full), local), f"{p.key}: take_local differs from the rank's tensor"
        mask = torch.zeros(p.full_shape, dtype=torch.int32)
        for piece in p.pieces():
            where = tuple(slice(o, o + n) for o, n in zip(piece.offsets, piece.sizes))
            assert torch.equal(full[where], local[piece.local]), f"{p.key}: a piece is not where it says"
            mask[where] += 1
        assert int(mask.max()) <= 1, f"{p.key}: pieces overlap"
        covered[p.key] = mask
        for alias in p.aliases:
            assert reference[alias].data_ptr() == reference[p.key].data_ptr() or torch.equal(
                reference[alias], reference[p.key]
            )
        placements = p.placements(mesh.mesh_dim_names)
        # a DTensor's global tensor is the STORED one: a fused projection's rows regrouped per y rank
        stored = full if p.order is None else full.index_select(0, torch.tensor(p.order))
        whole = DTensor.from_local(local, mesh, placements, run_check=False)
        assert torch.equal(whole.full_tensor(), stored), f"{p.key}: its DTensor gathers to another tensor"
        # parallelize placed every parameter (an unsplit one Replicate): the parameter gathers to the stored tensor
        assert is_placed(p.tensor) == isinstance(p.tensor, torch.nn.Parameter), p.key
        if is_placed(p.tensor):
            placed += 1
            fused_placed += p.order is not None
            assert p.tensor.placements == placements, p.key
            assert torch.equal(p.tensor.full_tensor(), stored), f"{p.key}: the parameter gathers to another"
    # every element of every tensor is held by some rank
    gathered = {}
    for key, mask in covered.items():
        total = mask.clone()
        torch.distributed.all_reduce(total)
        gathered[key] = bool((total > 0).all())
    fused = sum(1 for p in layout.params.values() if p.order is not None)
    vocab = sum(1 for p in layout.params.values() if p.region == "tensor")
    vocab_placed = sum(1 for p in layout.params.values() if p.region == "tensor" and is_placed(p.tensor))
    return {
        "covered": gathered,
        "placed": placed,
        "fused": fused,
        "fused_placed": fused_placed,
        "vocab": vocab,
        "vocab_placed": vocab_placed,
        "n": len(layout.params),
    }


@pytest.mark.parametrize("model_type", FAMILIES)
def test_pieces_cut_the_serial_tensors(model_type: str) -> None:
    for sizes in GRIDS:
        results = run_distributed(4, _check, model_type, sizes)
        for result in results:
            missing = [k for k, ok in result["covered"].items() if not ok]
            assert not missing, f"{model_type} on {sizes}: no rank holds part of {missing}"
            assert result["placed"] > 0, f"{model_type} on {sizes}: no parameter is a DTensor"
        if sizes.get("y", 1) > 1 and model_type in ("gpt2", "phi3"):
            assert results[0]["fused"] > 0, f"{model_type} on {sizes}: expected regrouped fused projections"
            assert results[0]["fused_placed"] == results[0]["fused"], f"{model_type} on {sizes}: a fused one is plain"
        if sizes.get("data", 1) == 1 and model_type != "gpt2":  # GPT-2's 50257 rows do not split in 4
            assert results[0]["vocab"] > 0, f"{model_type} on {sizes}: expected vocabulary-parallel tables"
            # rows in mesh order (x outermost): a DTensor with Shard(0) on every split axis, even over two of them
            assert results[0]["vocab_placed"] == results[0]["vocab"], f"{model_type} on {sizes}: a table is not placed"


def test_placements_refuse_a_split_out_of_mesh_order() -> None:
    """DTensor's Shard nests mesh dims in mesh order (x, y, z): a dim split over z then y would gather to another
    tensor, so placements refuses it instead of describing it wrongly; in mesh order it is Shard(0) on both."""
    from torch.distributed.tensor import Replicate, Shard

    from engine.models.layout import ParamLayout

    sizes, coords = {"data": 1, "x": 1, "y": 2, "z": 2}, {"data": 0, "x": 0, "y": 1, "z": 0}
    table = ParamLayout("table", (8, 4), coords, sizes, split=(("z", 0), ("y", 0)))
    with pytest.raises(ValueError, match="not in the mesh's order"):
        table.placements(("y", "z"))
    assert ParamLayout("table", (8, 4), coords, sizes, split=(("y", 0), ("z", 0))).placements(("y", "z")) == (
        Shard(0),
        Shard(0),
    )
    assert ParamLayout("norm", (4,), coords, sizes).placements(("y", "z")) == (Replicate(), Replicate())


def _inner_model(_: int) -> str:
    from engine.training.state import sync_gradients

    grid = init(x=2)
    model = parallelize(_serial("llama"), grid)
    try:
        sync_gradients(model.model, grid)  # the base model inside: its regions are in the outer model's record
    except ValueError as error:
        return str(error)
    return "no error"


def test_a_part_of_a_parallelized_model_is_refused() -> None:
    """Readers given a part of a parallelized model (whose record of regions sits on the model parallelize was given)
    refuse instead of summing its gradients over the wrong axes."""
    for message in run_distributed(2, _inner_model, 0):
        assert "part of a model parallelize was given" in message, message


def _changed_after_parallelize(_: int) -> dict[str, str]:
    from engine.training.state import full_state_dict

    grid = init()
    out = {}
    for change in ("added", "reshaped", "tied"):
        model = parallelize(_serial("llama"), grid)
        if change == "added":
            model.extra = torch.nn.Linear(4, 2)
        elif change == "reshaped":
            model.model.norm.weight = torch.nn.Parameter(torch.ones(3))
        else:
            model.lm_head.weight = model.model.embed_tokens.weight
        try:
            full_state_dict(model, grid)
            out[change] = "no error"
        except ValueError as error:
            out[change] = str(error)
    return out


def test_a_model_changed_after_parallelize_is_refused() -> None:
    """Every reader iterates the recorded layout: a tensor added, reshaped or tied afterwards would be skipped or cut
    silently, so binding the layout refuses it."""
    (out,) = run_distributed(1, _changed_after_parallelize, 0)
    for change, message in out.items():
        assert "not as parallelize laid it out" in message, (change, message)


class _Wrapper(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner


def _zero_on_a_wrapper(_: int) -> str | None:
    from engine.memory.zero import shard_data_axis
    from engine.spec import ZeroConfig

    grid = init(data=2, x=2)
    wrapper = _Wrapper(parallelize(_serial("llama"), grid))
    shard_data_axis(wrapper, grid, ZeroConfig(stage=2))
    return plan_of(wrapper, grid).params["inner.model.layers.0.input_layernorm.weight"].region


def test_zero_on_a_wrapper_keeps_the_inner_models_regions() -> None:
    """ZeRO records its state in the layout of the model it is given; a wrapper around a parallelized model must keep
    the inner model's regions (a decoder norm's gradient is summed over z and data, not over x and y as well)."""
    assert run_distributed(4, _zero_on_a_wrapper, 0) == ["layer"] * 4


def _torch_optimizer_steps(_: int) -> dict[str, bool]:
    from engine.core.placement import is_placed, local_shard, refuse_mixed
    from engine.models.layout import unplace_parameters
    from engine.training.state import full_state_dict

    grid = init(x=2)
    serial = _serial("llama").double()
    ids = torch.randint(0, serial.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(1))
    hooks: list[int] = []

    def trained(build, placed: bool) -> dict[str, torch.Tensor]:
        model = parallelize(copy.deepcopy(serial), grid)
        if not placed:
            unplace_parameters(model)
        optimizer = build(model.parameters())
        optimizer.register_step_pre_hook(lambda *_: hooks.append(1))
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))

        def closure() -> torch.Tensor:  # forward and backward, as Lightning's Trainer hands them to step
            optimizer.zero_grad()
            loss = model(input_ids=ids).logits.float().square().mean()
            loss.backward()
            torch.nn.utils.clip_grad_value_(model.parameters(), 1e-3)  # Lightning's clip-by-value
            return loss

        for _ in range(2):
            optimizer.step(closure)
            scheduler.step()
        return full_state_dict(model, grid)

    out = {}
    cases = {  # foreach=True: what torch picks on a GPU; the same optimizer on plain shards, then on DTensors
        "AdamW foreach": lambda ps: torch.optim.AdamW(ps, lr=0.01, foreach=True),
        "SGD foreach": lambda ps: torch.optim.SGD(ps, lr=0.01, foreach=True),
        "AdamW one tensor at a time": lambda ps: torch.optim.AdamW(ps, lr=0.01, foreach=False),
    }
    for name, build in cases.items():
        hooks.clear()
        a, b = trained(build, False), trained(build, True)
        out[f"{name}: same weights"] = all(torch.equal(a[key], b[key]) for key in a)
        out[f"{name}: each step hook once"] = len(hooks) == 4
    model = parallelize(copy.deepcopy(serial), grid)
    model(input_ids=ids).logits.float().square().mean().backward()
    out["every parameter placed"] = all(is_placed(p) for p in model.parameters())
    clipped = [local_shard(p.grad).clamp(-1e-3, 1e-3) for p in model.parameters()]
    torch.nn.utils.clip_grad_value_(model.parameters(), 1e-3)  # torch's own, over every placed gradient
    out["torch's clip_grad_value_ clips"] = all(
        torch.equal(local_shard(p.grad), c) for p, c in zip(model.parameters(), clipped)
    )
    extra = torch.nn.Parameter(torch.zeros(3))  # added beside the parallelized model, never placed
    try:
        refuse_mixed([{"params": list(model.parameters())}, {"params": [extra]}], "the optimizer")
        out["a plain parameter beside placed ones is refused"] = False
    except ValueError as error:
        out["a plain parameter beside placed ones is refused"] = "before engine.parallelize" in str(error)
    refuse_mixed(list(model.parameters()), "the optimizer")  # every parameter placed: accepted
    grid.close()
    return out


def test_torch_optimizers_step_placed_parameters() -> None:
    """Every parameter placed: torch's optimizers (foreach and one tensor at a time) and clip_grad_value_ take them
    unchanged, bit for bit as the same optimizer on plain shards, with a closure, a scheduler and step hooks run once
    per step; an optimizer over placed and plain parameters together is refused in one line."""
    for out in run_distributed(2, _torch_optimizer_steps, 0):
        assert all(out.values()), out
