"""parallelize / auto_parallelize / sync_gradients / clip_grad_norm_ / full_state_dict on tiny HF models.

Reference: the serial model on the same global batch. Each rank feeds its own rows; the sum of the ranks'
summed token losses equals the serial summed loss, and after sync_gradients every gradient equals the
serial gradient. Models run in float64, but HF's LlamaRMSNorm computes in float32 even for float64 inputs,
so both models carry float32 rounding (~6e-8 relative) and the parallel one sums some products in other
orders: differences stay below ~1e-6 relative. rtol=atol=1e-5 leaves margin and still catches any wrong
or missing term (O(1e-2) or more). GPT-2's LayerNorm stays in float64: 1e-9 there.
"""

from __future__ import annotations

import copy
import functools
import weakref
from itertools import product

import pytest
import torch
import torch.nn.functional as F
from distributed import run_distributed
from torch.overrides import TorchFunctionMode

from engine.core import comm
from engine.core.grid import AXES, init
from engine.core.linear import ParallelLinear, ShardingError
from engine.core.placement import is_placed, local_shard
from engine.core.vocab_parallel import is_vocab_parallel
from engine.models.auto import auto_parallelize
from engine.models.layout import plan_of
from engine.models.parallelize import parallelize
from engine.training.state import clip_grad_norm_, full_state_dict, load_full_state_dict, sync_gradients

_TORCH_LINEAR = torch.nn.modules.linear.Linear  # the class itself, whatever torch.nn.Linear names
LLAMA_TOL = {"rtol": 1e-5, "atol": 1e-5}
GPT2_TOL = {"rtol": 1e-9, "atol": 1e-9}
ROWS, SEQ, VOCAB = 2, 8, 128
STEPS, LR, MAX_NORM = 5, 1e-2, 1.0


def llama(seed: int = 0, heads: int = 8, kv_heads: int = 4, attn: str = "sdpa"):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=64,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        num_hidden_layers=2,
        vocab_size=VOCAB,
        intermediate_size=128,
        max_position_embeddings=64,
        attention_bias=True,
        attn_implementation=attn,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


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
    return GPT2LMHeadModel(config)


def batch(world: int, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Global batch of world*ROWS rows: token ids and an attention mask with right padding on some rows."""
    gen = torch.Generator().manual_seed(100 + step)
    ids = torch.randint(0, VOCAB, (world * ROWS, SEQ), generator=gen)
    lengths = torch.randint(SEQ // 2, SEQ + 1, (world * ROWS,), generator=gen)
    mask = (torch.arange(SEQ)[None, :] < lengths[:, None]).long()
    return ids, mask


def loss_sum(model, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids, attention_mask=mask).logits
    targets = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
    return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), targets.reshape(-1), reduction="sum")


def full_grads(model, grid) -> dict[str, torch.Tensor]:
    """Every parameter's gradient as the serial model names and shapes it (collective)."""
    modules = dict(model.named_modules())
    out = {}
    for name, param in model.named_parameters():
        owner, _, attr = name.rpartition(".")
        module = modules[owner]
        grad = param.grad
        if isinstance(module, ParallelLinear):
            grad = module.gather_weight(grad) if attr == "weight" else module.gather_bias(grad)
            if attr == "weight" and module.serial_layout == "conv1d":
                grad = grad.t()
        elif is_vocab_parallel(module):  # embeddings / lm_head split by vocabulary rows (on by default)
            grad = module.gather_rows(grad)
        else:  # an unsplit parameter: a Replicate DTensor, its gradient too
            grad = local_shard(grad)
        out[name] = grad
    return out


def meta_built(make) -> torch.nn.Module:
    """The serial model auto_parallelize equals (engine/models/auto.py): built on the meta device from make's seed,
    then initialised by transformers itself."""
    with torch.device("meta"):
        model = make()
    model.to_empty(device="cpu")
    model.tie_weights()  # to_empty unties
    model.initialize_weights()
    return model


def built_unpatched(make) -> torch.nn.Module:
    """make(), checking that neither torch.nn.Linear nor transformers' post_init is replaced while it runs."""
    from transformers.modeling_utils import PreTrainedModel

    assert torch.nn.Linear is _TORCH_LINEAR, "torch.nn.Linear is replaced while the model is built"
    post_init = PreTrainedModel.post_init
    assert post_init.__qualname__ == "PreTrainedModel.post_init", "post_init is replaced while the model is built"
    return make()


def serial_reference(make, world: int) -> dict:
    """Loss, gradients, clipped norms and losses of STEPS AdamW steps of the serial model."""
    model = make().double()
    ids, mask = batch(world)
    loss = loss_sum(model, ids, mask)
    loss.backward()
    ref = {
        "state": {k: v.clone() for k, v in model.state_dict().items()},
        "loss": loss.item(),
        "grads": {n: p.grad.clone() for n, p in model.named_parameters()},
    }
    model.zero_grad()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    losses, norms = [], []
    for step in range(STEPS):
        ids, mask = batch(world, step)
        loss = loss_sum(model, ids, mask)
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM).item())
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    ref.update(losses=losses, norms=norms, final={k: v.clone() for k, v in model.state_dict().items()})
    return ref


def _world_sum(value: torch.Tensor, grid) -> float:
    return comm.all_reduce(value.detach().reshape(1), grid.group(*AXES)).item()


def check_grid(
    make, ref: dict, shape: tuple[int, int, int, int], tol: dict, train: bool = True, auto: bool = False
) -> None:
    """Build the parallel model (parallelize a copy of the serial one, or build it under auto_parallelize
    from the same seed), then compare weights, loss, gradients and optionally STEPS AdamW steps."""
    data, x, y, z = shape
    grid = init(data=data, x=x, y=y, z=z)
    try:
        if auto:
            model = auto_parallelize(grid, functools.partial(built_unpatched, make))
            model.double()
            random_after = torch.rand(1)
            meta_built(make)
            assert torch.equal(random_after, torch.rand(1)), "auto_parallelize drew other random numbers"
            assert all(isinstance(p, torch.nn.Parameter) and not local_shard(p).is_meta for p in model.parameters())
        else:
            model = parallelize(copy.deepcopy(make().double()), grid)
        state = full_state_dict(model, grid)
        assert state.keys() == ref["state"].keys()
        for key, value in ref["state"].items():
            assert torch.equal(state[key], value), f"full_state_dict differs at {key}"
        mine = slice(grid.rank * ROWS, (grid.rank + 1) * ROWS)
        ids, mask = batch(grid.world_size)
        loss = loss_sum(model, ids[mine], mask[mine])
        loss.backward()
        sync_gradients(model, grid)
        assert _world_sum(loss, grid) == pytest.approx(ref["loss"], rel=1e-9)
        grads = full_grads(model, grid)
        for name, grad in ref["grads"].items():
            torch.testing.assert_close(grads[name], grad, **tol, msg=lambda m, n=name: f"grad {n}: {m}")
        # parallelize placed every split tensor: torch's own gather of its gradient is the serial gradient (a
        # collective over the grid's mesh, in the same parameter order on every rank), a fused projection's in its
        # stored row order (the layout's `order` maps it back)
        layouts = plan_of(model, grid).params
        placed = [(name, p) for name, p in model.named_parameters() if is_placed(p)]
        assert placed or grid.size("x", "y", "z") == 1, "no parameter is a DTensor on a tensor-parallel grid"
        for name, param in placed:
            whole, order = param.grad.full_tensor(), layouts[name].order
            if order is not None:
                whole = torch.empty_like(whole).index_copy_(0, torch.tensor(order), whole)
            torch.testing.assert_close(
                whole.t() if layouts[name].serial_transposed else whole, ref["grads"][name], **tol, msg=name
            )
        if not train:
            return
        model.zero_grad()
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
        for step in range(STEPS):
            ids, mask = batch(grid.world_size, step)
            loss = loss_sum(model, ids[mine], mask[mine])
            loss.backward()
            sync_gradients(model, grid)
            norm = clip_grad_norm_(model, MAX_NORM, grid)
            assert norm.item() == pytest.approx(ref["norms"][step], rel=1e-5), f"step {step} grad norm"
            optimizer.step()
            optimizer.zero_grad()
            assert _world_sum(loss, grid) == pytest.approx(ref["losses"][step], rel=1e-5), f"step {step} loss"
        final = full_state_dict(model, grid, rank0_only=True)
        if grid.rank == 0:
            for key, value in ref["final"].items():
                torch.testing.assert_close(final[key], value, **tol, msg=lambda m, k=key: f"after training {k}: {m}")
        else:
            assert final == {}
    except AssertionError as error:
        raise AssertionError(f"grid data={data} x={x} y={y} z={z}: {error}") from error
    finally:
        grid.close()


def grids_of(world: int) -> list[tuple[int, int, int, int]]:
    return [g for g in product(range(1, world + 1), repeat=4) if g[0] * g[1] * g[2] * g[3] == world]


def _worker(make_name: str, ref: dict, shapes: list, train: bool, auto: bool) -> int:
    make, tol = {"llama": (llama, LLAMA_TOL), "gpt2": (gpt2, GPT2_TOL)}[make_name]
    for shape in shapes:
        check_grid(make, ref, shape, tol, train, auto)
    return len(shapes)


def run(make_name: str, world: int, shapes: list, train: bool = True, auto: bool = False) -> None:
    make = {"llama": llama, "gpt2": gpt2}[make_name]
    ref = serial_reference(functools.partial(meta_built, make) if auto else make, world)  # once, in the test process
    assert run_distributed(world, _worker, make_name, ref, shapes, train, auto) == [len(shapes)] * world


WORLD8_SAMPLE = [(1, 2, 2, 2), (2, 2, 2, 1), (1, 2, 4, 1), (1, 8, 1, 1), (1, 1, 2, 4), (2, 1, 1, 4), (8, 1, 1, 1)]


def test_llama_every_grid_of_world_4() -> None:
    run("llama", 4, grids_of(4))


def test_llama_every_grid_of_world_1_and_2() -> None:
    run("llama", 1, grids_of(1))
    run("llama", 2, grids_of(2))


def test_llama_sample_of_world_8() -> None:
    run("llama", 8, [(1, 2, 2, 2), (2, 1, 4, 1)], train=False)


def test_gpt2_grids() -> None:
    run("gpt2", 4, [(1, 2, 2, 1), (2, 1, 1, 2)])


def test_auto_parallelize_builds_the_serial_model() -> None:
    run("llama", 4, [(1, 2, 2, 1), (1, 1, 1, 4)], train=False, auto=True)
    run("gpt2", 2, [(1, 1, 2, 1)], train=False, auto=True)


@pytest.mark.slow
def test_llama_training_on_a_sample_of_world_8() -> None:
    run("llama", 8, WORLD8_SAMPLE)


@pytest.mark.slow
def test_gpt2_and_auto_on_every_grid_of_world_4() -> None:
    run("gpt2", 4, grids_of(4))
    run("llama", 4, grids_of(4), train=False, auto=True)


def _plain_torch_model(shape: tuple[int, int, int, int]) -> float:
    """A model that is not a transformer, built under auto_parallelize: every Linear becomes a default-mode
    ParallelLinear (nn.Linear semantics on each rank's rows); compare with the serial model."""
    grid = init(*shape)
    torch.manual_seed(5)
    serial = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 8)).double()
    torch.manual_seed(5)
    model = auto_parallelize(
        grid, lambda: torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 8))
    ).double()  # as the serial model: drawn in float32, then converted
    assert all(isinstance(m, ParallelLinear) and m.mode == "default" for m in (model[0], model[2]))
    x = torch.randn(grid.world_size * 3, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    serial(x).square().sum().backward()
    mine = slice(grid.rank * 3, (grid.rank + 1) * 3)
    out = model(x[mine])
    out.square().sum().backward()
    sync_gradients(model, grid)
    torch.testing.assert_close(out, serial(x)[mine], rtol=1e-10, atol=1e-10)
    for m, s in ((model[0], serial[0]), (model[2], serial[2])):
        torch.testing.assert_close(m.gather_weight(m.weight.grad), s.weight.grad, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(m.gather_bias(m.bias.grad), s.bias.grad, rtol=1e-10, atol=1e-10)
    state = full_state_dict(model, grid)
    assert all(torch.equal(state[k], v) for k, v in serial.state_dict().items())
    grid.close()
    return 1.0


def test_auto_parallelize_plain_torch_model() -> None:
    run_distributed(4, _plain_torch_model, (1, 2, 2, 1))


def _family(name: str):
    import transformers

    config, model, extra = {
        "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", {}),  # fused query_key_value, interleaved per head
        "phi3": ("Phi3Config", "Phi3ForCausalLM", {"num_key_value_heads": 2, "pad_token_id": 0}),  # fused qkv, gate_up
        "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {"num_key_value_heads": 2, "pad_token_id": 0}),  # q/k norms
    }[name]
    sizes = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "intermediate_size": 128}
    built = getattr(transformers, config)(**sizes, vocab_size=VOCAB, max_position_embeddings=64, **extra)
    torch.manual_seed(1)
    return getattr(transformers, model)(built)


def _families(names: list[str]) -> list[str]:
    """auto_parallelize on y=2: each family's full weights equal its meta-built serial model's, bit for bit."""
    grid = init(y=2)
    differ = []
    for name in names:
        make = functools.partial(_family, name)
        state = full_state_dict(auto_parallelize(grid, make), grid)
        differ += [f"{name} {k}" for k, v in meta_built(make).state_dict().items() if not torch.equal(state[k], v)]
    grid.close()
    return differ


def test_auto_parallelize_fused_families() -> None:
    assert run_distributed(2, _families, ["gpt_neox", "phi3", "olmo2"]) == [[], []]


class _LiveBytes(TorchFunctionMode):
    """While active: the bytes of the CPU storages that torch calls return and that are still alive, and their peak
    (a storage is counted once, from the first call that returns it, until it is freed)."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self.alive: set[int] = set()

    def _freed(self, key: int, nbytes: int) -> None:
        self.alive.discard(key)
        self.live -= nbytes

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            tensor = local_shard(tensor)  # a placed DTensor's storage is its local shard's
            if isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu":
                storage = tensor.untyped_storage()
                if id(storage) not in self.alive:
                    self.alive.add(id(storage))
                    self.live += storage.nbytes()
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(storage, self._freed, id(storage), storage.nbytes())
        return out


def _deep_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=64,
        num_attention_heads=8,
        num_key_value_heads=4,
        num_hidden_layers=8,
        vocab_size=VOCAB,
        intermediate_size=256,
        max_position_embeddings=64,
    )
    torch.manual_seed(3)
    return LlamaForCausalLM(config)


def _peak_bytes() -> tuple[int, int, int, int]:
    """(peak bytes while auto_parallelize runs, bytes the parallel model holds, one full layer, the full model)."""
    grid = init(x=2)
    with torch.device("meta"):
        serial = _deep_llama()
    layer = sum(t.nbytes for t in serial.model.layers[0].state_dict().values())
    whole = sum(t.nbytes for t in serial.state_dict().values())
    with _LiveBytes() as counter:
        model = auto_parallelize(grid, _deep_llama, vocab_parallel=False)
    held = sum(local_shard(t).nbytes for t in {id(t): t for t in [*model.parameters(), *model.buffers()]}.values())
    grid.close()
    return counter.peak, held, layer, whole


def test_auto_parallelize_holds_one_full_layer_at_most() -> None:
    """The whole model never exists on a rank: the peak is what the rank keeps plus one full decoder layer (today
    exactly; a quarter layer of slack for temporaries). 8 layers split over x=2: whole model then shards would need
    3 layers more."""
    for peak, held, layer, whole in run_distributed(2, _peak_bytes):
        assert held + layer + layer // 4 < whole
        assert peak <= held + layer + layer // 4, f"peak {peak} bytes: kept {held}, a layer {layer}, whole {whole}"


class _Scaled(torch.nn.Linear):
    def __init__(self) -> None:
        super().__init__(4, 4)
        self.scale = torch.nn.Parameter(torch.ones(4))  # not drawn in reset_parameters: lost on meta


def _scaled_model() -> torch.nn.Module:
    return torch.nn.Sequential(_Scaled())


def _tied_model() -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.Linear(4, 8, bias=False))
    model[1].weight = model[0].weight  # tied after construction: the serial value is the embedding's draw
    return model


def _auto_refusal(build) -> str:
    """The ShardingError auto_parallelize raises for `build` on a one-rank grid, or "no error"."""
    grid = init()
    try:
        auto_parallelize(grid, build)
    except ShardingError as error:
        return str(error)
    finally:
        grid.close()
    return "no error"


def test_auto_parallelize_refuses_a_weight_its_initialisation_never_writes() -> None:
    (message,) = run_distributed(1, _auto_refusal, _scaled_model)
    assert "never writes 0.scale" in message, message


def test_auto_parallelize_refuses_tied_tensors_of_a_plain_torch_model() -> None:
    (message,) = run_distributed(1, _auto_refusal, _tied_model)
    assert "1.weight is tied to 0.weight" in message, message


def _errors() -> dict[str, str]:
    grid = init(y=2, x=2)
    out = {}

    def catch(key, fn):
        try:
            fn()
            out[key] = "no error"
        except (ShardingError, RuntimeError) as error:  # RuntimeError: torch's own strict load_state_dict
            out[key] = f"{type(error).__name__}: {error}"

    catch("kv heads", lambda: parallelize(llama(heads=4, kv_heads=1), grid))
    catch("no layers", lambda: parallelize(torch.nn.Sequential(torch.nn.Linear(4, 4)), grid))
    extra = llama()
    extra.model.layers[1].self_attn.rope_scale = torch.nn.Linear(2, 2)
    catch("unknown module", lambda: parallelize(extra, grid))
    model = parallelize(llama(), grid)
    other = init(x=4)
    catch("other grid", lambda: parallelize(model, other))
    serial = llama().state_dict()
    catch(
        "wrong shard shape",
        lambda: load_full_state_dict(model, {**serial, "model.layers.0.mlp.up_proj.weight": torch.zeros(3, 3)}, grid),
    )
    catch(
        "missing key",
        lambda: load_full_state_dict(model, {k: v for k, v in serial.items() if k != "model.norm.weight"}, grid),
    )
    other.close()
    grid.close()
    return out


def test_clear_errors() -> None:
    out = run_distributed(4, _errors)[0]
    assert "ShardingError: model.layers.0: 1 key/value heads are not divisible by y=2" in out["kv heads"]
    assert "ShardingError: parallelize found no decoder layers it can shard in Sequential" in out["no layers"]
    assert (
        "model.layers.1.self_attn.rope_scale (Linear) has parameters the engine cannot shard" in out["unknown module"]
    )
    assert "already parallelized on another grid" in out["other grid"]
    assert (
        "ShardingError: model.layers.0.mlp.up_proj.weight: expected a full weight of shape (128, 64)"
        in out["wrong shard shape"]
    )
    assert "Missing key(s)" in out["missing key"] and "model.norm.weight" in out["missing key"]


def _load_roundtrip() -> bool:
    """load_full_state_dict puts a serial state into a parallel model built from another seed."""
    grid = init(data=1, x=2, y=1, z=2)
    serial = gpt2(seed=0)
    model = parallelize(gpt2(seed=1), grid)
    load_full_state_dict(model, serial.state_dict(), grid)
    state = full_state_dict(model, grid)
    same = state.keys() == serial.state_dict().keys() and all(
        torch.equal(state[k], v) for k, v in serial.state_dict().items()
    )
    grid.close()
    return same


def test_load_full_state_dict_round_trip() -> None:
    assert run_distributed(4, _load_roundtrip) == [True] * 4


def _autocast_llama(ref: dict) -> float:
    """bf16 autocast through a parallelized Llama: loss and gradients near the serial autocast run. Both
    round to bf16 (relative step 0.4%) in different places; per-parameter relative gradient error (in
    norm) below 5% and loss within 1% catch any wrong or missing term, which costs O(1)."""
    grid = init(1, 2, 2, 1)
    model = parallelize(llama(), grid)
    mine = slice(grid.rank * ROWS, (grid.rank + 1) * ROWS)
    ids, mask = batch(grid.world_size)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = loss_sum(model, ids[mine], mask[mine])
    loss.backward()
    sync_gradients(model, grid)
    assert _world_sum(loss.float(), grid) == pytest.approx(ref["loss"], rel=1e-2)
    worst = 0.0
    for name, grad in full_grads(model, grid).items():
        worst = max(worst, ((grad - ref["grads"][name]).norm() / ref["grads"][name].norm()).item())
    grid.close()
    assert worst < 5e-2, worst
    return worst


def test_autocast_bf16_llama() -> None:
    model = llama()
    ids, mask = batch(4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = loss_sum(model, ids, mask)
    loss.backward()
    ref = {"loss": loss.item(), "grads": {n: p.grad.clone() for n, p in model.named_parameters()}}
    run_distributed(4, _autocast_llama, ref)


def _generate(shape: tuple[int, int, int, int]) -> bool:
    """Greedy generation on each rank's own prompts equals the serial model's. HF generate keeps a padded
    attention mask on some ranks and drops an all-ones one on others, and ranks finish at different
    steps (synced_gpus keeps them stepping together): both must not break the x*y row gathers."""
    grid = init(*shape)
    serial = llama()
    serial.generation_config.pad_token_id = 0
    model = parallelize(copy.deepcopy(serial), grid)
    prompts = torch.randint(0, VOCAB, (grid.world_size * 2, 6), generator=torch.Generator().manual_seed(3))
    mine = slice(grid.rank * 2, (grid.rank + 1) * 2)
    expected = serial.generate(prompts, max_new_tokens=5, do_sample=False)[mine]
    got = model.generate(prompts[mine], max_new_tokens=5, do_sample=False, synced_gpus=True)
    grid.close()
    return torch.equal(expected, got)


def test_generate_matches_serial() -> None:
    assert run_distributed(4, _generate, (1, 2, 2, 1)) == [True] * 4


def _mixed_inputs() -> str:
    """One rank passes no attention mask, the other a padded one; then the ranks feed different row counts."""
    grid = init(x=2)
    serial = llama()
    model = parallelize(copy.deepcopy(serial), grid)
    ids, mask = batch(2)
    mask[:ROWS] = 1  # rank 0's rows: no padding, so rank 0 may pass no mask at all
    expected = serial(input_ids=ids, attention_mask=mask).logits[grid.rank * ROWS : (grid.rank + 1) * ROWS]
    mine = slice(grid.rank * ROWS, (grid.rank + 1) * ROWS)
    logits = model(input_ids=ids[mine], attention_mask=None if grid.rank == 0 else mask[mine]).logits
    torch.testing.assert_close(logits, expected, **LLAMA_TOL)
    try:
        model(input_ids=ids[: ROWS + grid.rank])
    except ShardingError as error:
        message = str(error)
    grid.close()
    return message


def test_ranks_with_different_inputs() -> None:
    for message in run_distributed(2, _mixed_inputs):
        assert "must feed the same number of rows and tokens" in message and "[(2, 8), (3, 8)]" in message
