"""Where plain DCP cannot reshard the engine's parameters, and why engine checkpoints keep their own chunks.

Every parameter of a parallelized model is a DTensor, so `dcp.save(model.state_dict())` / `dcp.load` run on it
(tests/parallel/test_torch_tools.py), but a DTensor's global tensor is the tensor as the ranks STORE it. A fused
projection whose family groups its output features in blocks (GPT-2's c_attn and Phi-3's qkv_proj: [q | k | v];
Phi-3's gate_up_proj: [gate | up]) is stored with its rows regrouped per y rank ([q_0 k_0 v_0 | q_1 k_1 v_1] at y=2,
engine.models.parallelize._grouped_order), so that each y rank holds whole heads; at y=1 it is stored in natural
order. The stored order depends on y, and the shape does not: a plain DCP checkpoint of a y=2 run loaded at x=2 or
data=2 is accepted and fills those rows in y=2's stored order, silently wrong (the loaded natural tensor is the serial
one permuted by y=2's ParamLayout.order). Engine checkpoints (engine.save_checkpoint) hand DCP each rank's chunks of
the NATURAL tensor (ParamLayout.pieces), so they load exactly at any grid.

What plain DCP does reshard (asserted too): every tensor without a regrouping, including a fused projection grouped
head by head (GPT-NeoX's query_key_value, [q_h k_h v_h] per head: a y slice of it is whole heads already, so its
stored order is natural at every y), and the vocabulary tables, whose rows are split in mesh order (x*Y*Z + y*Z + z,
engine.core.vocab_parallel.vocab_block), the order DTensor's Shard nests mesh dims in, so that their global tensor is
the natural table at every grid; a vocabulary not divisible by x*y*z is refused at parallelize (ShardingError), never
padded. At the saving grid (y=2 again) plain DCP loads everything exactly.

Every parameter is drawn from a normal distribution (norm weights and biases included: a permuted vector of ones or
zeros would equal itself), so every comparison is of distinct values and exact (loading only moves data).
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from distributed import run_distributed
from tiny_models import tiny_family, tiny_gpt2

from engine.core.grid import init
from engine.models.layout import plan_of
from engine.models.parallelize import parallelize
from engine.training.checkpoint import load_checkpoint, save_checkpoint
from engine.training.state import full_state_dict

VOCAB = 128
SAVE_GRID = {"y": 2}
LOAD_GRIDS = ({"y": 2}, {"x": 2}, {"data": 2})  # the saving grid, then two grids at y=1
REGROUPED = {  # family -> its fused projections regrouped per y (their stored order differs from natural at y=2)
    "gpt2": ("attn.c_attn.",),
    "phi3": ("self_attn.qkv_proj.", "mlp.gate_up_proj."),
    "gpt_neox": (),  # query_key_value is fused head by head: natural at every y
}


def _serial(family: str, seed: int) -> torch.nn.Module:
    """A tiny model of `family` whose every parameter is drawn from N(0, 1) with `seed`."""
    model = tiny_gpt2(vocab=VOCAB, hidden=32) if family == "gpt2" else tiny_family(family, vocab=VOCAB)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator))
    return model


def _roundtrips(tmp: str, family: str) -> bytes:
    """Save `family`'s model parallelized at SAVE_GRID with plain DCP and with engine.save_checkpoint; load each into
    a fresh model (other weights) at every LOAD_GRID, plain DCP into `model.state_dict()` and the engine's with
    engine.load_checkpoint. Rank 0's result: the saving grid's stored orders and the loaded full state dicts."""
    import torch.distributed.checkpoint as dcp

    plain_dir, engine_dir = Path(tmp) / family / "dcp", Path(tmp) / family / "engine"
    out: dict = {}
    with init(**SAVE_GRID) as grid:
        model = parallelize(_serial(family, seed=0), grid)
        out["orders"] = {
            p.key: (torch.tensor(p.order), 1 if p.serial_transposed else 0)
            for p in plan_of(model, grid).params.values()
            if p.order is not None
        }
        dcp.save(model.state_dict(), checkpoint_id=plain_dir)
        save_checkpoint(engine_dir, model, None, grid)
    for shape in LOAD_GRIDS:
        with init(**shape) as grid:
            plain = parallelize(_serial(family, seed=123), grid)
            dcp.load(plain.state_dict(), checkpoint_id=plain_dir)  # in place: the state dict's tensors are the model's
            own = parallelize(_serial(family, seed=123), grid)
            load_checkpoint(engine_dir, own, None, grid)
            out[str(shape)] = {"plain DCP": full_state_dict(plain, grid), "engine": full_state_dict(own, grid)}
    if torch.distributed.get_rank() != 0:
        return b""
    buffer = io.BytesIO()  # tensors cross the process boundary by value
    torch.save(out, buffer)
    return buffer.getvalue()


@pytest.mark.parametrize("family", sorted(REGROUPED))
def test_plain_dcp_misloads_regrouped_fused_rows_at_another_y(family: str, tmp_path: Path) -> None:
    """At y=1, plain DCP fills a fused projection regrouped per y with y=2's stored rows (the serial rows permuted by
    its order) and every other tensor right; engine checkpoints load every tensor exactly at every grid."""
    results = torch.load(io.BytesIO(run_distributed(2, _roundtrips, str(tmp_path), family)[0]), weights_only=True)
    serial = _serial(family, seed=0).state_dict()
    orders = results["orders"]
    regrouped = {key for key in serial if any(part in key for part in REGROUPED[family])}
    assert set(orders) == regrouped, "the fused projections regrouped at y=2"
    for shape in LOAD_GRIDS:
        loaded = results[str(shape)]
        for key, value in serial.items():
            assert torch.equal(loaded["engine"][key], value), f"engine checkpoint at {shape}: {key}"
            plain = loaded["plain DCP"][key]
            if key not in orders or shape == SAVE_GRID:
                assert torch.equal(plain, value), f"plain DCP at {shape}: {key}"
                continue
            order, dim = orders[key]
            assert not torch.equal(plain, value), f"plain DCP at {shape} loaded {key} right"
            stored = value.index_select(dim if value.dim() > 1 else 0, order)
            assert torch.equal(plain, stored), f"plain DCP at {shape}: {key} is not y=2's stored order"
