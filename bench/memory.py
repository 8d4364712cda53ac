"""Per-rank memory of parameters, gradients and AdamW state for every grid and ZeRO stage, beside the prediction.

    python bench/memory.py --world 4 --json bench/results/memory_world4.json
    python bench/memory.py --table options --json bench/results/memory_options_world4.json
    python bench/memory.py --table zeropp --world 4 8 --steps 5 --json bench/results/zeropp_world4_8.json
    python bench/memory.py --table pipe --json bench/results/memory_pipe2.json

For each ordered grid of the world size and each ZeRO stage the grid allows (stages 1-3 need data >= 2; at
data >= 4 also stage 3 with a hierarchy of node size 2, and stage 2 and 3 with optimizer offload), every rank
builds the same Llama, parallelizes it, partitions it (engine.memory.zero.shard_data_axis), and runs `--steps`
training steps (forward, backward, sync_gradients, clip_grad_norm_, AdamW step) on gloo. Reported per setting:
the bytes of parameters, gradients and AdamW moments the rank holds between steps (engine.memory.zero.held_bytes, the
largest rank) beside engine.planner.cost_model.zero_held_bytes (must be equal), the bytes sent per step by the
largest sender beside engine.planner.cost_model.llama_step_collectives (must be equal), and the median step time on
gloo (CPU processes sharing the machine's cores: it shows what each stage adds, not GPU speed). The step is
`goldfish train`'s: engine.core.vocab_parallel.causal_lm_token_losses (the chunked loss), summed.

`--table pipe` (world 2): goldfish's tiny-llama (vocabulary 2,048, float32) trained 2 SGD steps by
engine.training.train at pipe=2; per rank the bytes of the parameters it holds (those not on the meta device) when
built, after the first step and after the run, beside its stage's count from the split
(engine.training.pipeline.split_model, which must be equal) and the whole model's; and the logged losses beside one
process's.

`--table options` (world 4, no ZeRO): a Llama with a 32,000-token vocabulary (untied embeddings and lm_head: 2 x 8.2M
of its 9.8M parameters) on the grids x=2,y=2 / data=2,x=2 / z=4, each with the vocabulary split (embeddings and
lm_head by vocabulary rows over x*y*z) on and off and activation checkpointing on and off. Per rank: the bytes of
the embedding and lm_head weights, their gradients and AdamW moments (counted from the tensors), and two activation
figures of one training step taken from the CPU allocator: every allocation and free the step makes, as torch's
profiler records them (profile_memory=True; CPU tensors have no allocator statistics like CUDA's
max_memory_allocated, and a saved_tensors_hooks count would miss what activation checkpointing keeps outside
autograd's saved tensors and the loss's transient chunks). Relative to the bytes alive when the step starts
(weights, gradients kept allocated, AdamW state): "saved" = alive when backward starts (what the forward keeps for
backward), "peak" = the most alive at any moment of forward + backward. Beside them
engine.planner.cost_model.memory_per_rank:
vocab_params x 4/4/8 bytes, detail "kept" (for saved) and `activations + transient` (for peak); the largest rank.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import time

import common
import torch
import torch.multiprocessing as mp
from transformers import LlamaConfig, LlamaForCausalLM

import engine
from conventions import IGNORE_INDEX
from engine.core.grid import GridShape
from engine.core.placement import local_shard
from engine.core.vocab_parallel import causal_lm_token_losses, is_vocab_parallel
from engine.memory.activation import checkpoint_decoder_layers
from engine.memory.zero import ZeroConfig, held_bytes, make_adamw, shard_data_axis
from engine.planner.cost_model import (
    StepSettings,
    TransformerShape,
    bytes_by_group,
    llama_step_collectives,
    memory_per_rank,
    ordered_grids,
    zero_held_bytes,
)

ROWS, SEQ = 2, 64  # per rank


def _config() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=2048,
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        intermediate_size=768,
        max_position_embeddings=128,
    )


def zeropp_settings(world: int) -> list[tuple[tuple[int, int, int, int], dict]]:
    """--table zeropp: the data axis alone (data=world), ZeRO 3, flat and hierarchical, each without quantization and
    with ZeRO++'s qwZ and qgZ; world 8 adds three levels (pairs inside nodes of 4)."""
    dims = (world, 1, 1, 1)
    both = {"quantize_weights": True, "quantize_gradients": True}
    out = [
        (dims, {"stage": 3}),
        (dims, {"stage": 3, "quantize_weights": True}),
        (dims, {"stage": 3, "quantize_gradients": True}),
        (dims, {"stage": 3, "quantize_gradients": True, "gradient_bits": 4}),
        (dims, {"stage": 3, **both}),
        (dims, {"stage": 3, "node_size": world // 2}),
        (dims, {"stage": 3, "node_size": world // 2, **both}),
    ]
    if world >= 8:
        out += [
            (dims, {"stage": 3, "node_size": world // 2, "inner_levels": (2,)}),
            (dims, {"stage": 3, "node_size": world // 2, "inner_levels": (2,), **both}),
        ]
    return out


def settings(world: int) -> list[tuple[tuple[int, int, int, int], dict]]:
    out = []
    for g in ordered_grids(world):
        dims = (g.data, g.x, g.y, g.z)
        out.append((dims, {"stage": 0}))
        if g.data >= 2:
            out += [(dims, {"stage": s}) for s in (1, 2, 3)]
        if g.data >= 4:
            out += [
                (dims, {"stage": 3, "node_size": 2}),
                (dims, {"stage": 2, "offload": True}),
                (dims, {"stage": 3, "offload": True}),
            ]
    return out


def _targets(rows: torch.Tensor) -> torch.Tensor:
    """Next-token targets of (B, S) ids: shifted left, IGNORE_INDEX at the last position."""
    targets = torch.full_like(rows, IGNORE_INDEX)
    targets[:, :-1] = rows[:, 1:]
    return targets


def _step(model, optimizer, rows, grid) -> float:
    """One training step; returns this rank's loss (the sum over its tokens) before the update."""
    optimizer.zero_grad(set_to_none=True)
    loss = causal_lm_token_losses(model, rows, _targets(rows)).sum()  # what `goldfish train` runs
    loss.backward()
    engine.sync_gradients(model, grid)
    engine.clip_grad_norm_(model, 1.0, grid)
    optimizer.step()
    return float(loss.detach())


def _worker(rank: int, world: int, port: int, cases: list, steps: int, queue) -> None:
    torch.set_num_threads(1)
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank)
    )
    for dims, zero_args in cases:
        data, x, y, z = dims
        grid = engine.init(data=data, x=x, y=y, z=z)
        zero = ZeroConfig(**zero_args)
        torch.manual_seed(0)
        model = shard_data_axis(engine.parallelize(LlamaForCausalLM(_config()), grid), grid, zero)
        optimizer = make_adamw(model, [{"params": list(model.parameters())}], lr=1e-3)
        rows = torch.randint(0, 2048, (ROWS, SEQ), generator=torch.Generator().manual_seed(rank))
        times, sent, losses = [], {}, []
        for i in range(steps + 1):  # the first step builds state (and FSDP's lazy init): not timed
            grid.traffic.reset()
            grid.traffic.enabled = True
            started = time.perf_counter()
            losses.append(_step(model, optimizer, rows, grid))
            if i:
                times.append(time.perf_counter() - started)
            grid.traffic.enabled = False
            sent = grid.traffic.reset()
        held = held_bytes(model, optimizer)
        queue.put((dims, zero_args, rank, grid.coord("data"), held, sent, statistics.median(times), losses))
        grid.close()


# ----- --table options: embeddings/lm_head bytes and activations with and without each option -----------------

OPTION_GRIDS = ((1, 2, 2, 1), (2, 2, 1, 1), (1, 1, 1, 4))  # x=2,y=2 / data=2,x=2 / z=4
OPTION_ROWS, OPTION_SEQ = 2, 128  # per rank


def _options_config() -> dict:
    return dict(vocab=32000, hidden=256, layers=2, heads=8, kv_heads=4, intermediate=768, seq=OPTION_SEQ)


def option_settings() -> list[tuple[tuple[int, int, int, int], bool, bool]]:
    return [(dims, split, ckpt) for dims in OPTION_GRIDS for split in (False, True) for ckpt in (False, True)]


def _vocab_bytes(model, optimizer) -> dict[str, int]:
    """Bytes of the input embedding and lm_head weights this rank holds, their gradients and AdamW moments."""
    out = {"params": 0, "grads": 0, "optimizer": 0}
    seen = set()
    for module in (model.get_input_embeddings(), model.get_output_embeddings()):
        p = module.weight
        if id(p) in seen:  # a tied lm_head shares the embedding's tensor
            continue
        seen.add(id(p))
        out["params"] += local_shard(p).numel() * p.element_size()  # a placed table: its local rows
        out["grads"] += local_shard(p.grad).numel() * p.grad.element_size()
        out["optimizer"] += sum(
            local_shard(v).numel() * v.element_size()
            for v in optimizer.state[p].values()
            if isinstance(v, torch.Tensor) and v.dim() > 0
        )
    return out


def _allocator_figures(step) -> dict[str, int]:
    """Run `step(mark)` (a forward and backward) under torch's profiler with profile_memory; `mark` is
    torch.profiler.record_function, which the step opens as "backward" where backward starts. Returns the bytes alive
    (relative to the start) when backward
    starts and the most alive at any moment, from the CPU allocator's allocation (+) and free (-) events."""
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step(record_function)
    events = list(prof.profiler.kineto_results.events())
    backward = min(e.start_ns() for e in events if e.name() == "backward")
    memory = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    alive = peak = saved = 0
    for when, nbytes in memory:
        alive += nbytes
        peak = max(peak, alive)
        if when < backward:
            saved = alive
    return {"saved": saved, "peak": peak}


def _options_worker(rank: int, world: int, port: int, cases: list, queue) -> None:
    torch.set_num_threads(1)
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank)
    )
    for dims, split, ckpt in cases:
        data, x, y, z = dims
        grid = engine.init(data=data, x=x, y=y, z=z)
        model = engine.parallelize(common.build_llama(**_options_config()), grid, vocab_parallel=split)
        assert is_vocab_parallel(model.get_output_embeddings()) == split
        if ckpt:
            checkpoint_decoder_layers(model)
        optimizer = make_adamw(model, [{"params": list(model.parameters())}], lr=1e-3)
        rows = torch.randint(0, 32000, (OPTION_ROWS, OPTION_SEQ), generator=torch.Generator().manual_seed(rank))
        targets = _targets(rows)

        def forward_backward(mark) -> None:
            loss = causal_lm_token_losses(model, rows, targets).sum()
            with mark("backward"):
                loss.backward()

        def update() -> None:
            engine.sync_gradients(model, grid)
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)  # gradients stay allocated: counted in the start's bytes

        forward_backward(lambda name: contextlib.nullcontext())  # builds gradients and AdamW state
        update()
        figures = _allocator_figures(forward_backward)
        update()
        queue.put((dims, split, ckpt, rank, _vocab_bytes(model, optimizer), figures))
        grid.close()


def run_options(json_path: str | None) -> None:
    config = _options_config()
    shape = TransformerShape.from_hf_config(
        LlamaConfig(
            vocab_size=config["vocab"],
            hidden_size=config["hidden"],
            num_hidden_layers=config["layers"],
            num_attention_heads=config["heads"],
            num_key_value_heads=config["kv_heads"],
            intermediate_size=config["intermediate"],
            max_position_embeddings=config["seq"],
        )
    )
    cases, world = option_settings(), 4
    port = common.free_port()
    context = mp.get_context("spawn")
    queue = context.Queue()
    procs = [context.Process(target=_options_worker, args=(r, world, port, cases, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results: dict[tuple, list] = {}
    for _ in range(world * len(cases)):
        dims, split, ckpt, rank, vocab, figures = queue.get(timeout=3600)
        results.setdefault((dims, split, ckpt), []).append((vocab, figures))
    for p in procs:
        p.join()
    rows_out = []
    for dims, split, ckpt in cases:
        per_rank = results[(dims, split, ckpt)]
        step = StepSettings(
            rows_per_rank=OPTION_ROWS, seq=OPTION_SEQ, act_bytes=4, param_bytes=4, recompute=ckpt, vocab_parallel=split
        )
        estimate = memory_per_rank(shape, GridShape(*dims), step)
        vocab_elements = estimate.detail["vocab_params"] if estimate.detail["vocab_parts"] > 1 else shape.vocab_params
        rows_out.append(
            {
                "grid": dict(zip(("data", "x", "y", "z"), dims)),
                "vocab_parallel": split,
                "activation_checkpointing": ckpt,
                "vocab_bytes": {k: max(r[0][k] for r in per_rank) for k in ("params", "grads", "optimizer")},
                "predicted_vocab_bytes": {
                    "params": vocab_elements * 4,
                    "grads": vocab_elements * 4,
                    "optimizer": vocab_elements * 8,
                },
                "saved_bytes": max(r[1]["saved"] for r in per_rank),
                "predicted_saved_bytes": estimate.detail["kept"],
                "peak_bytes": max(r[1]["peak"] for r in per_rank),
                "predicted_peak_bytes": estimate.activations + estimate.transient,
                "estimate_detail": {
                    "activations": estimate.activations,
                    "transient": estimate.transient,
                    **{k: estimate.detail[k] for k in ("kept", "loss_chunk", "head_grad", "layer_activations")},
                },
            }
        )
    mib = 1 / 2**20
    print(
        f"Llama vocabulary {shape.vocab}, hidden {shape.hidden}, {shape.layers} layers, {OPTION_ROWS} x {OPTION_SEQ} "
        f"tokens per rank, world 4, fp32; per rank (largest rank), MiB measured / predicted (ratio)"
    )
    print(
        f"{'grid (data,x,y,z)':<18} {'vocab split':<11} {'ckpt':<5} {'emb+head W':>22} {'grad':>7} {'AdamW':>7} "
        f"{'saved for backward':>24} {'peak in fwd+bwd':>24}"
    )

    def pair(measured: float, predicted: float) -> str:
        return f"{measured * mib:7.2f} / {predicted * mib:7.2f} ({measured / predicted:4.2f})"

    for row in rows_out:
        v, pv = row["vocab_bytes"], row["predicted_vocab_bytes"]
        print(
            f"{str(tuple(row['grid'].values())):<18} {'on' if row['vocab_parallel'] else 'off':<11} "
            f"{'on' if row['activation_checkpointing'] else 'off':<5} {pair(v['params'], pv['params']):>22} "
            f"{'=' if v['grads'] == pv['grads'] else 'NO':>7} {'=' if v['optimizer'] == pv['optimizer'] else 'NO':>7} "
            f"{pair(row['saved_bytes'], row['predicted_saved_bytes']):>24} "
            f"{pair(row['peak_bytes'], row['predicted_peak_bytes']):>24}"
        )
    if json_path:
        written = common.write_result(
            json_path, {"model": shape.__dict__, "rows_per_rank": OPTION_ROWS, "seq": OPTION_SEQ, "rows": rows_out}
        )
        print(f"wrote {written}")


# ----- --table pipe: the parameter bytes each pipeline rank holds (its own stages) ------------------------------

PIPE_VOCAB, PIPE_SEQ, PIPE_ROWS, PIPE_STEPS = 2048, 64, 8, 2  # goldfish's tiny-llama at a 2,048-token vocabulary


def _pipe_model() -> torch.nn.Module:
    """goldfish's tiny-llama (goldfish.app.models), drawn from seed 0 in float32."""
    from goldfish.app.models import TINY_MODELS

    torch.manual_seed(0)
    return LlamaForCausalLM(TINY_MODELS["tiny-llama"].make_config(PIPE_VOCAB, PIPE_SEQ))


def _pipe_train(model: torch.nn.Module, grid, stop=None) -> list[float]:
    """PIPE_STEPS SGD steps of PIPE_ROWS random rows through engine.training.train; the logged losses."""
    from engine.training.train import StepLoss, TokenLossFn, TrainConfig, train

    ids = torch.randint(0, PIPE_VOCAB, (PIPE_ROWS, PIPE_SEQ), generator=torch.Generator().manual_seed(1))
    rows = [{"input_ids": row, "targets": _targets(row[None])[0]} for row in ids]

    def reduce(losses: torch.Tensor, batch: dict) -> StepLoss:
        kept = batch["targets"] != IGNORE_INDEX
        return StepLoss(loss_sum=losses[kept].sum(), n_tokens=int(kept.sum()))

    config = TrainConfig(batch_size=PIPE_ROWS, epochs=PIPE_STEPS, optimizer="sgd", lr=0.1, progress=False)
    result = train(
        model, rows, TokenLossFn(targets=lambda b: b["targets"], reduce=reduce), config, grid=grid, stop=stop
    )
    return [record["loss"] for record in result.history]


def _held_params(model: torch.nn.Module) -> int:
    """The bytes of the parameters this rank holds (a pipeline's other stages sit on the meta device)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if not p.is_meta)


def _pipe_worker(rank: int, world: int, port: int, queue) -> None:
    torch.set_num_threads(1)
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank)
    )
    grid = engine.init(pipe=world)
    model = engine.parallelize(_pipe_model(), grid)
    built, stepping = _held_params(model), []
    losses = _pipe_train(model, grid, stop=lambda: stepping.append(_held_params(model)) or False)
    queue.put(
        {"rank": rank, "built": built, "after_step_1": stepping[0], "after_run": _held_params(model), "losses": losses}
    )
    grid.close()


def run_pipe(json_path: str | None, world: int = 2) -> None:
    """--table pipe: each rank's parameter bytes at pipe=`world` beside the split's count and the whole model's."""
    from engine.training.pipeline import split_model

    whole = _pipe_model()
    total = _held_params(whole)
    expected = [_held_params(stage) for stage in split_model(whole, world)]
    serial = _pipe_train(_pipe_model(), None)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.get_context("spawn")
    queue = context.Queue()
    procs = [context.Process(target=_pipe_worker, args=(r, world, port, queue)) for r in range(world)]
    for proc in procs:
        proc.start()
    ranks = sorted((queue.get(timeout=600) for _ in procs), key=lambda row: row["rank"])
    for proc in procs:
        proc.join()
    print(
        f"tiny-llama, vocabulary {PIPE_VOCAB}, float32: {total} parameter bytes; pipe={world}, {PIPE_STEPS} SGD steps"
    )
    print("| pipe rank | built | after step 1 | after the run | the split's stage | share of the model |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in ranks:
        share = row["after_run"] / total
        print(
            f"| {row['rank']} | {row['built']} | {row['after_step_1']} | {row['after_run']} | "
            f"{expected[row['rank']]} | {share:.1%} |"
        )
    print(f"losses: pipe={world} {ranks[0]['losses']}, one process {serial}")
    if json_path:
        result = {
            "model": "tiny-llama",
            "vocab": PIPE_VOCAB,
            "seq": PIPE_SEQ,
            "rows": PIPE_ROWS,
            "pipe": world,
            "model_bytes": total,
            "split_bytes": expected,
            "ranks": ranks,
            "one_process_losses": serial,
        }
        print(f"wrote {common.write_result(json_path, result)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, nargs="+", default=[4])
    parser.add_argument("--steps", type=int, default=3, help="timed steps per setting (default: %(default)s)")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write every row as JSON")
    parser.add_argument(
        "--table",
        choices=("zero", "zeropp", "options", "pipe"),
        default="zero",
        help="zero: held and sent bytes per grid and ZeRO stage; zeropp: bytes per level and the loss with ZeRO++'s "
        "quantized collectives and hierarchies on data=world; options: embeddings/lm_head bytes "
        "and activations with and without the vocabulary split and activation checkpointing "
        "(world 4; --world and --steps do not apply); pipe: the parameter bytes of each rank of pipe=2 on "
        "tiny-llama (--world and --steps do not apply) (default: %(default)s)",
    )
    args = parser.parse_args()
    if args.table == "options":
        run_options(args.json)
        return
    if args.table == "pipe":
        run_pipe(args.json)
        return
    shape = TransformerShape.from_hf_config(_config())
    rows_out = []
    for world in args.world:
        cases = zeropp_settings(world) if args.table == "zeropp" else settings(world)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        context = mp.get_context("spawn")
        queue = context.Queue()
        procs = [context.Process(target=_worker, args=(r, world, port, cases, args.steps, queue)) for r in range(world)]
        for p in procs:
            p.start()
        results: dict[tuple, list] = {}
        for _ in range(world * len(cases)):
            dims, zero_args, rank, data_rank, held, sent, seconds, losses = queue.get(timeout=3600)
            results.setdefault((dims, tuple(sorted(zero_args.items()))), []).append(
                (rank, data_rank, held, sent, seconds, losses)
            )
        for p in procs:
            p.join()
        for dims, zero_args in cases:
            per_rank = results[(dims, tuple(sorted(zero_args.items())))]
            grid, zero = GridShape(*dims), ZeroConfig(**zero_args)
            held = {k: max(r[2][k] for r in per_rank) for k in ("params", "grads", "optimizer")}
            predicted = {k: max(zero_held_bytes(shape, grid, zero, data_rank=r[1])[k] for r in per_rank) for k in held}
            sent = max(sum(r[3].values()) for r in per_rank)
            predicted_by_rank = [
                bytes_by_group(
                    llama_step_collectives(
                        shape,
                        grid,
                        StepSettings(rows_per_rank=ROWS, seq=SEQ, param_bytes=4, act_bytes=4, stream_bytes=4),
                        zero=zero if zero.stage else None,
                        data_rank=r[1],
                    )
                )
                for r in per_rank
            ]
            predicted_sent = max(sum(p.values()) for p in predicted_by_rank)
            rank0 = next(i for i, r in enumerate(per_rank) if r[0] == 0)
            rows_out.append(
                {
                    "world": world,
                    "grid": dict(zip(("data", "x", "y", "z"), dims)),
                    "zero": zero.to_json(),
                    "held_bytes": held,
                    "predicted_held_bytes": predicted,
                    "sent_bytes": sent,
                    "predicted_sent_bytes": predicted_sent,
                    "step_s": statistics.median(r[4] for r in per_rank),
                    "sent_by_group": {k: v for k, v in per_rank[rank0][3].items() if v},  # rank 0, per step
                    "predicted_sent_by_group": predicted_by_rank[rank0],
                    "loss_sum": [sum(values) for values in zip(*(r[5] for r in per_rank))],  # all ranks, per step
                }
            )

    if args.table == "zeropp":
        print_zeropp(rows_out)
    else:
        print_zero(shape, rows_out)
    if args.json:
        written = common.write_result(
            args.json, {"model": shape.__dict__, "rows_per_rank": ROWS, "seq": SEQ, "rows": rows_out}
        )
        print(f"wrote {written}")


def zero_label(z: dict) -> str:
    """A short name of a ZeRO setting (its to_json form): "3 levels 2,4,8 qwZ qgZ-int4"."""
    levels = [*z.get("inner_levels", []), z["node_size"]] if z["node_size"] > 1 else []
    parts = [str(z["stage"])]
    if levels:
        parts.append("levels " + ",".join(map(str, levels)))
    if z["offload"]:
        parts.append("offload")
    if z.get("quantize_weights"):
        parts.append("qwZ")
    if z.get("quantize_gradients"):
        parts.append("qgZ" + ("-int4" if z.get("gradient_bits") == 4 else ""))
    return " ".join(parts)


def print_zeropp(rows_out: list[dict]) -> None:
    """Per setting: KiB rank 0 sends per step at each level (measured = predicted?), the total against the flat
    unquantized ZeRO 3 of the same world, and the summed loss at the last step against that run's."""
    mib = 1 / 2**20
    print(
        "rank 0's MiB sent per step by group (= cost model?), total x flat unquantized ZeRO 3, loss at the last step "
        "(sum over ranks' tokens) and its difference to the unquantized run of the same hierarchy"
    )
    baselines: dict[tuple, dict] = {}
    for row in rows_out:
        z = row["zero"]
        key = (row["world"], z["node_size"], tuple(z.get("inner_levels", [])))
        if not z["quantize_weights"] and not z["quantize_gradients"]:
            baselines[key] = row
    flat = {row["world"]: row for row in rows_out if zero_label(row["zero"]) == "3"}
    for row in rows_out:
        z = row["zero"]
        key = (row["world"], z["node_size"], tuple(z.get("inner_levels", [])))
        groups = ", ".join(f"{g} {b * mib:.3f}" for g, b in sorted(row["sent_by_group"].items()))
        same = "yes" if row["sent_by_group"] == row["predicted_sent_by_group"] else "NO"
        total = sum(row["sent_by_group"].values()) / sum(flat[row["world"]]["sent_by_group"].values())
        loss, base = row["loss_sum"][-1], baselines[key]["loss_sum"][-1]
        print(
            f"data={row['world']:<3} {zero_label(z):<26} {groups:<62} {same:>3} x{total:5.3f} "
            f"loss {loss:9.3f} ({loss - base:+.3f})"
        )


def print_zero(shape: TransformerShape, rows_out: list[dict]) -> None:
    serial = zero_held_bytes(shape, GridShape())
    mib = 1 / 2**20
    print(
        f"serial Llama ({shape.n_params / 1e6:.2f}M parameters): params {serial['params'] * mib:.2f} MiB, grads "
        f"{serial['grads'] * mib:.2f} MiB, AdamW {serial['optimizer'] * mib:.2f} MiB; per rank below: largest rank, "
        "MiB held between steps (= predicted?), MiB sent per step (= predicted?), median step seconds on gloo"
    )
    print(
        f"{'world':>5} {'grid (data,x,y,z)':<18} {'zero':<14} {'params':>8} {'grads':>8} {'AdamW':>8} {'=pred':>5} "
        f"{'sent':>8} {'=pred':>5} {'step s':>7}"
    )
    for row in rows_out:
        z = row["zero"]
        label = (
            f"{z['stage']}"
            + (f" node {z['node_size']}" if z["node_size"] > 1 else "")
            + (" offload" if z["offload"] else "")
        )
        held = row["held_bytes"]
        print(
            f"{row['world']:>5} {str(tuple(row['grid'].values())):<18} {label:<14} {held['params'] * mib:>8.2f} "
            f"{held['grads'] * mib:>8.2f} {held['optimizer'] * mib:>8.2f} "
            f"{'yes' if held == row['predicted_held_bytes'] else 'NO':>5} {row['sent_bytes'] * mib:>8.2f} "
            f"{'yes' if row['sent_bytes'] == row['predicted_sent_bytes'] else 'NO':>5} {row['step_s']:>7.3f}"
        )


if __name__ == "__main__":
    main()
