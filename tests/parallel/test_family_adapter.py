"""A model family added in one place: a FamilyAdapter (engine/models/family.py) passed to parallelize.

The toy family below is a plain torch module, not a transformers model: a base model ("toy") whose config declares no
tensor-parallel plan, with decoder layers of one MLP each. Its adapter (the docs/contributing.md walk: an explicit plan
of one colwise/rowwise pair) is handed to parallelize explicitly; nothing is registered. Parallelized on a 1-process
grid, and on y=2 (the MLP split over y, each rank on its own rows), its loss and gradients equal one process's
(float32: ~1e-6 relative; a wrong split or a missed sum is O(1e-1)). Without the adapter the engine finds no decoder
layers: nothing is sharded on one process, and a tensor-parallel grid is refused.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from distributed import run_distributed
from torch import nn

from engine.core.grid import init
from engine.core.linear import ParallelLinear, ShardingError
from engine.models.families import known_families
from engine.models.family import FamilyAdapter
from engine.models.parallelize import parallelize
from engine.training.state import full_state_dict, sync_gradients

VOCAB, HIDDEN, SEQ, ROWS = 32, 16, 5, 4
TOL = {"rtol": 1e-4, "atol": 1e-6}

TOY = FamilyAdapter(model_type="toy", tp_plan={"layers.*.mlp.up": "colwise", "layers.*.mlp.down": "rowwise"})


class ToyConfig:
    """What the engine reads of a config: the family name and the head counts (the MLP is split by y like heads)."""

    model_type = "toy"
    hidden_size = HIDDEN
    num_attention_heads = 2
    vocab_size = VOCAB


class ToyMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(HIDDEN, 4 * HIDDEN), nn.Linear(4 * HIDDEN, HIDDEN)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(h)))


class ToyLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm, self.mlp = nn.LayerNorm(HIDDEN), ToyMLP()

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.mlp(self.norm(h))


class ToyModel(nn.Module):
    """The base model: embeddings and decoder layers (what transformers calls e.g. LlamaModel)."""

    def __init__(self) -> None:
        super().__init__()
        self.config = ToyConfig()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList([ToyLayer(), ToyLayer()])

    @property
    def base_model(self) -> nn.Module:
        return self

    def get_input_embeddings(self) -> nn.Module:
        return self.embed

    def forward(self, input_ids: torch.Tensor | None = None, inputs_embeds: torch.Tensor | None = None):
        h = self.embed(input_ids) if inputs_embeds is None else inputs_embeds  # (B, T, H)
        for layer in self.layers:
            h = layer(h)
        return h


class ToyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.model, self.lm_head = ToyModel(), nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.model(input_ids=ids))  # (B, T, V)


def _loss_sum(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    logits = model(ids)
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten(), reduction="sum")


def _worker(y: int) -> int:
    grid = init(y=y)
    serial = ToyLM()
    ids = torch.randint(0, VOCAB, (ROWS, SEQ), generator=torch.Generator().manual_seed(1))  # (B, T)
    if y == 1:
        plain = parallelize(copy.deepcopy(serial), grid)  # without the adapter: no decoder layers found
        assert not any(isinstance(m, ParallelLinear) for m in plain.modules())
    else:
        with pytest.raises(ShardingError, match="found no decoder layers"):
            parallelize(copy.deepcopy(serial), grid)
    model = parallelize(copy.deepcopy(serial), grid, vocab_parallel=False, families=(*known_families(), TOY))
    assert sum(isinstance(m, ParallelLinear) for m in model.modules()) == 4  # up and down of both layers
    share = ROWS // grid.world_size
    mine = ids[grid.rank * share : (grid.rank + 1) * share]  # this rank's own rows
    loss = _loss_sum(model, mine)
    loss.backward()
    sync_gradients(model, grid)
    total = loss.detach().clone()
    torch.distributed.all_reduce(total)  # every rank's loss sum: the step's
    expected = _loss_sum(serial, ids)
    expected.backward()
    torch.testing.assert_close(total, expected.detach(), **TOL)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.grad)  # full_state_dict then gathers the full gradients under the serial names
    grads = full_state_dict(model, grid)
    for name, p in serial.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, **TOL, msg=lambda m, n=name: f"{n}: {m}")
    return 1


def test_a_toy_family_through_its_adapter_equals_one_process() -> None:
    assert run_distributed(1, _worker, 1) == [1]
    assert run_distributed(2, _worker, 2) == [1, 1]
