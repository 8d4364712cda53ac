"""Vocabulary-parallel embeddings / lm_head and the chunked cross-entropy (engine/core/vocab_parallel.py).

References: F.cross_entropy on full logits, and goldfish.loss.goldfish_loss on the serial model's logits (the
kept / dropped / all losses and counts of the goldfish mask). Float64 models: Llama's RMSNorm computes in float32
(see test_engine_parallelize), so Llama comparisons use 1e-5; the loss function alone and GPT-2 are compared at
1e-9 or tighter.
"""

from __future__ import annotations

import copy
from itertools import product

import pytest
import torch
import torch.nn.functional as F
from distributed import run_distributed

from engine.core import comm
from engine.core.grid import AXES, init
from engine.core.linear import ParallelLinear, ShardingError
from engine.core.placement import local_shard
from engine.core.vocab_parallel import TokenLossLinear, causal_lm_token_losses, is_vocab_parallel, token_losses
from engine.models.parallelize import parallelize
from engine.training.state import clip_grad_norm_, sync_gradients
from goldfish.loss import goldfish_loss, goldfish_loss_from_token_losses
from goldfish.masks import causal_targets, drop_mask

ROWS, SEQ, VOCAB = 2, 8, 128
TOL = {"llama": {"rtol": 1e-5, "atol": 1e-6}, "gpt2": {"rtol": 1e-9, "atol": 1e-10}}


def llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=64,
        num_attention_heads=8,
        num_key_value_heads=4,
        num_hidden_layers=2,
        vocab_size=VOCAB,
        intermediate_size=128,
        max_position_embeddings=64,
        attention_bias=True,
        tie_word_embeddings=True,
        pad_token_id=3,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).double()


def gpt2(seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_embd=64,
        n_head=4,
        n_layer=2,
        vocab_size=VOCAB,
        n_positions=32,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    torch.manual_seed(seed)
    return GPT2LMHeadModel(config).double()


MODELS = {"llama": llama, "gpt2": gpt2}


# ----- the loss function alone ---------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [1, 3, 7, 1000])
def test_token_losses_equal_cross_entropy(chunk: int) -> None:
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 5, 16, dtype=torch.float64, generator=gen, requires_grad=True)
    weight = torch.randn(50, 16, dtype=torch.float64, generator=gen, requires_grad=True)
    targets = torch.randint(0, 50, (3, 5), generator=gen)
    targets[0, 1] = targets[2, 4] = -100
    upstream = torch.randn(3, 5, dtype=torch.float64, generator=gen)
    reference = F.cross_entropy((hidden @ weight.t()).flatten(0, 1), targets.flatten(), reduction="none").view(3, 5)
    ref_grads = torch.autograd.grad((reference * upstream).sum(), (hidden, weight))
    losses = token_losses(hidden, weight, targets, chunk_tokens=chunk)
    grads = torch.autograd.grad((losses * upstream).sum(), (hidden, weight))
    assert losses.dtype == torch.float64 and losses.shape == (3, 5)
    assert losses[0, 1] == 0 and losses[2, 4] == 0
    torch.testing.assert_close(losses, reference, rtol=1e-12, atol=1e-12)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_token_losses_under_bf16_autocast_match_the_logits_path() -> None:
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(6, 32, generator=gen)
    weight = torch.randn(40, 32, generator=gen)
    targets = torch.randint(0, 40, (6,), generator=gen)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        reference = F.cross_entropy(F.linear(hidden, weight).float(), targets, reduction="none")
        losses = token_losses(hidden, weight, targets, chunk_tokens=4)
    assert losses.dtype == torch.float32
    torch.testing.assert_close(losses, reference, rtol=1e-6, atol=1e-6)  # same bf16 logits, float32 softmax


def test_token_losses_bad_input() -> None:
    with pytest.raises(ValueError, match="chunk_tokens"):
        token_losses(torch.zeros(2, 4), torch.zeros(5, 4), torch.zeros(2, dtype=torch.long), chunk_tokens=0)
    with pytest.raises(ValueError, match="hidden size"):
        token_losses(torch.zeros(2, 4), torch.zeros(5, 3), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="must agree"):
        token_losses(torch.zeros(2, 4), torch.zeros(5, 4), torch.zeros(3, dtype=torch.long))


# ----- the goldfish loss of a model -----------------------------------------------------------------------------


def goldfish_batch(world: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, targets, dropped) of world*ROWS rows, hashed goldfish mask with k=3, a few ignored targets."""
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(0, VOCAB, (world * ROWS, SEQ), generator=gen)
    targets = causal_targets(ids)
    targets[0, 2] = -100
    dropped = drop_mask(targets, "hashed", 3, 2)
    return ids, targets, dropped


def _check_goldfish(mine, ref, tol) -> None:
    assert (mine.n_kept, mine.n_all, mine.n_dropped) == (ref.n_kept, ref.n_all, ref.n_dropped)
    for name in ("loss", "loss_sum", "all_loss", "dropped_loss"):
        torch.testing.assert_close(getattr(mine, name).double(), getattr(ref, name).double(), **tol, msg=name)


@pytest.mark.parametrize("name", list(MODELS))
def test_serial_goldfish_losses_unchanged(name: str) -> None:
    ids, targets, dropped = goldfish_batch(1)
    reference_model = MODELS[name]()
    model = copy.deepcopy(reference_model)
    ref = goldfish_loss(reference_model(input_ids=ids).logits, targets, dropped)
    ref.loss_sum.backward()
    mine = goldfish_loss_from_token_losses(
        causal_lm_token_losses(model, ids, targets, chunk_tokens=5), targets, dropped
    )
    mine.loss_sum.backward()
    assert mine.n_dropped > 0
    _check_goldfish(mine, ref, {"rtol": 1e-6, "atol": 1e-6})  # goldfish_loss computes CE in float32
    ref_grads = dict(reference_model.named_parameters())
    for key, param in model.named_parameters():
        torch.testing.assert_close(param.grad, ref_grads[key].grad, rtol=1e-5, atol=1e-6, msg=key)


def test_the_head_becomes_a_loss_head_once() -> None:
    """The lm_head's forward is never rebound: the first loss gives the head its loss class (same object, same
    state-dict keys), later losses change nothing, and outside a loss it returns the logits as before, also after a
    forward that raised."""
    ids, targets, _ = goldfish_batch(1)
    model = llama()
    reference = copy.deepcopy(model)
    head, keys = model.lm_head, list(model.state_dict())
    causal_lm_token_losses(model, ids, targets)
    assert type(head) is TokenLossLinear and model.lm_head is head and list(model.state_dict()) == keys
    causal_lm_token_losses(model, ids, targets)
    assert type(head) is TokenLossLinear and "forward" not in vars(head)
    with pytest.raises(IndexError):  # token ids beyond the vocabulary: the model's forward raises inside the loss
        causal_lm_token_losses(model, ids + VOCAB, targets)
    torch.testing.assert_close(model(input_ids=ids).logits, reference(input_ids=ids).logits, rtol=0, atol=0)


def test_other_models_fall_back_to_logits() -> None:
    class Wrapped(torch.nn.Module):  # not a known HF architecture: the loss goes through model(...).logits
        def __init__(self) -> None:
            super().__init__()
            self.inner = gpt2()

        def forward(self, **kwargs):
            return self.inner(**kwargs)

    ids, targets, dropped = goldfish_batch(1)
    model = Wrapped()
    losses = causal_lm_token_losses(model, ids, targets)
    reference = F.cross_entropy(
        model(input_ids=ids).logits.float().flatten(0, 1), targets.flatten(), reduction="none"
    ).view(targets.shape)
    torch.testing.assert_close(losses, reference)


# ----- every grid --------------------------------------------------------------------------------------------


def serial_reference(world: int) -> dict:
    ids, targets, dropped = goldfish_batch(world)
    out = {}
    for name, make in MODELS.items():
        model = make()
        logits = model(input_ids=ids).logits
        result = goldfish_loss(logits, targets, dropped)  # CE in float32: the reference of the loss values
        # gradients in float64: the kept targets' CE on float64 logits (goldfish_loss's float32 softmax would
        # limit the comparison to ~1e-7)
        token_ce64 = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view(targets.shape)
        kept = (targets != -100) & ~dropped
        torch.where(kept, token_ce64, torch.zeros_like(token_ce64)).sum().backward()
        summary = {
            "loss_sum": result.loss_sum.item(),
            "all_loss": result.all_loss.item(),
            "dropped_loss": result.dropped_loss.item(),
            "n_kept": result.n_kept,
            "n_all": result.n_all,
            "n_dropped": result.n_dropped,
        }
        out[name] = {
            "logits": logits.detach(),
            "result": summary,
            "grads": {k: p.grad.clone() for k, p in model.named_parameters()},
            "norm": torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9).item(),
            "token_ce": token_ce64.detach(),
        }
    return out


def full_grads(model) -> dict[str, torch.Tensor]:
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


def _world_sum(values: list[float], grid) -> list[float]:
    return comm.all_reduce(torch.tensor(values, dtype=torch.float64), grid.group(*AXES)).tolist()


def _worker(shapes: list[tuple[int, int, int, int]], ref: dict) -> int:
    for shape in shapes:
        data, x, y, z = shape
        grid = init(data=data, x=x, y=y, z=z)
        try:
            mine = slice(grid.rank * ROWS, (grid.rank + 1) * ROWS)
            ids, targets, dropped = goldfish_batch(grid.world_size)
            for name, make in MODELS.items():
                tol, expected = TOL[name], ref[name]
                model = parallelize(make(), grid)
                embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
                split = x * y * z > 1
                assert is_vocab_parallel(embedding) == split and is_vocab_parallel(head) == split, (shape, name)
                assert head.weight is embedding.weight  # both models tie their lm_head
                assert local_shard(embedding.weight).shape[0] == VOCAB // (x * y * z)
                # the module path (evaluation, generation): full logits of own rows
                with torch.no_grad():
                    logits = model(input_ids=ids[mine]).logits
                torch.testing.assert_close(logits, expected["logits"][mine], **tol)
                # the training path: per-token losses without full logits, split by the goldfish mask
                token_ce = causal_lm_token_losses(model, ids[mine], targets[mine], chunk_tokens=5)
                # float32 losses (as goldfish_loss computes them)
                torch.testing.assert_close(token_ce.double(), expected["token_ce"][mine].double(), rtol=1e-6, atol=1e-6)
                result = goldfish_loss_from_token_losses(token_ce, targets[mine], dropped[mine])
                result.loss_sum.backward()
                reference = expected["result"]
                sums = _world_sum(
                    [
                        result.loss_sum.item(),
                        float(result.all_loss.nan_to_num()) * result.n_all,
                        float(result.dropped_loss.nan_to_num()) * result.n_dropped,
                        result.n_kept,
                        result.n_all,
                        result.n_dropped,
                    ],
                    grid,
                )
                assert sums[3:] == [reference["n_kept"], reference["n_all"], reference["n_dropped"]]
                assert sums[0] == pytest.approx(reference["loss_sum"], rel=1e-6)
                assert sums[1] / sums[4] == pytest.approx(reference["all_loss"], rel=1e-6)
                assert sums[2] / sums[5] == pytest.approx(reference["dropped_loss"], rel=1e-6)
                sync_gradients(model, grid)
                grads = full_grads(model)
                for key, grad in expected["grads"].items():
                    torch.testing.assert_close(grads[key], grad, **tol, msg=lambda m, k=key: f"{shape} {name} {k}: {m}")
                assert clip_grad_norm_(model, 1e9, grid).item() == pytest.approx(expected["norm"], rel=1e-6)
        finally:
            grid.close()
    return len(shapes)


def grids_of(world: int) -> list[tuple[int, int, int, int]]:
    return [g for g in product(range(1, world + 1), repeat=4) if g[0] * g[1] * g[2] * g[3] == world]


def test_every_grid_of_world_4() -> None:
    shapes = grids_of(4)
    assert run_distributed(4, _worker, shapes, serial_reference(4)) == [len(shapes)] * 4


@pytest.mark.slow
def test_sample_of_world_8() -> None:
    shapes = [(1, 2, 2, 2), (2, 2, 1, 2), (1, 8, 1, 1)]
    assert run_distributed(8, _worker, shapes, serial_reference(8)) == [len(shapes)] * 8


def _refusals() -> list[str]:
    grid = init(x=2)
    messages = []
    try:
        parallelize(llama(), init(x=1, data=2), vocab_parallel=True)
    except ShardingError as error:
        messages.append(str(error))
    from transformers import GPT2Config, GPT2LMHeadModel

    odd = GPT2LMHeadModel(GPT2Config(n_embd=64, n_head=4, n_layer=1, vocab_size=VOCAB + 1, n_positions=32))
    model = parallelize(copy.deepcopy(odd), grid)  # default: kept whole, since 129 does not divide by 2
    messages.append(str(is_vocab_parallel(model.get_input_embeddings())))
    try:
        parallelize(odd, grid, vocab_parallel=True)
    except ShardingError as error:
        messages.append(str(error))
    grid.close()
    return messages


def test_vocab_parallel_refusals_and_default() -> None:
    messages = run_distributed(2, _refusals)[0]
    assert "no tensor parallelism" in messages[0]
    assert messages[1] == "False"
    assert "vocabulary 129 is not divisible by x*y*z=2" in messages[2]
