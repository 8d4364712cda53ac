"""What the benchmarks share: their options, one Llama builder, one training step, timing, and one result writer.

Each script declares its options with `add_options(parser, flag=default, ...)`, naming only the flags it takes and
its own defaults; a flag's type and help live once, in `OPTIONS`. The scripts run as `python bench/x.py` or under
torchrun, so bench/ is sys.path[0] and `import common` finds this file.

    parser = argparse.ArgumentParser(description=__doc__)
    common.add_options(parser, vocab=2048, hidden=256, layers=4, seq=256, steps=30, threads=None)
    args = common.parse(parser)                        # validated; --threads applied
    model = common.build_llama(**common.model_shape(args), heads=args.hidden // 64)
    step = lambda: common.train_step(model, optimizer, ids)
    _, seconds = common.timed(step)
    common.write_result(args.out, {"step_s": seconds})  # JSON with the command line, written atomically
"""

from __future__ import annotations

import argparse
import shlex
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

import torch
import torch.distributed as dist
import torch.nn.functional as F

import engine
from data.atomic import write_json_atomic

T = TypeVar("T")


def _at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    parse.__name__ = "int"  # argparse names the type in its messages
    return parse


# flag -> (type, help). The model-shape fields are also the keyword names of `build_llama`.
OPTIONS: dict[str, tuple[Callable[[str], Any], str]] = {
    "vocab": (_at_least(2), "vocabulary size of the random Llama"),
    "hidden": (_at_least(1), "hidden size"),
    "layers": (_at_least(1), "decoder layers"),
    "heads": (_at_least(1), "attention heads (as many key/value heads)"),
    "intermediate": (_at_least(1), "MLP intermediate size"),
    "seq": (_at_least(2), "tokens per sequence"),
    "steps": (_at_least(1), "timed steps"),
    "warmup": (_at_least(0), "untimed warm-up steps"),
    "rounds": (_at_least(1), "interleaved rounds over the contenders (machine drift hits all alike)"),
    "threads": (_at_least(0), "torch CPU threads (0 or unset: torch's default)"),
    "device": (str, "torch device (cpu, cuda, cuda:1, ...)"),
    "out": (str, "write the results as JSON to this file"),
    "json": (str, "also write the figures to this JSON file"),
}
SHAPE = ("vocab", "hidden", "layers", "heads", "intermediate", "seq")


def add_options(parser: argparse.ArgumentParser, help: dict[str, str] | None = None, **defaults: Any) -> None:
    """Add the shared flags named in `defaults` (e.g. `hidden=256`), in that order, with those defaults.

    `help` replaces the shared help text of some flags where a script means something more particular.
    """
    unknown = sorted(set(defaults) - set(OPTIONS))
    if unknown:
        raise ValueError(f"no shared bench option {unknown}; declare script-only flags in the script itself")
    for name, default in defaults.items():
        kind, text = OPTIONS[name]
        parser.add_argument(f"--{name}", type=kind, default=default, help=(help or {}).get(name, text))


def parse(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """Parse `argv` (default: sys.argv[1:]) and apply --threads where the script declares it."""
    args = parser.parse_args(argv)
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    return args


def model_shape(args: argparse.Namespace) -> dict[str, int]:
    """The model-shape flags this script declares (a subset of SHAPE), as keywords for `build_llama`."""
    return {name: getattr(args, name) for name in SHAPE if getattr(args, name, None) is not None}


def build_llama(
    *,
    vocab: int,
    hidden: int,
    layers: int,
    heads: int,
    seq: int,
    intermediate: int | None = None,
    kv_heads: int | None = None,
    seed: int = 0,
    **hf_config: Any,
) -> torch.nn.Module:
    """A randomly initialised HF LlamaForCausalLM (fp32, CPU), the same weights for the same arguments and seed.

    intermediate defaults to 4 x hidden and kv_heads to heads; `hf_config` goes to LlamaConfig as it is
    (attn_implementation, initializer_range, tie_word_embeddings, special token ids). `seq` is
    max_position_embeddings, the longest sequence the model takes.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads if kv_heads is None else kv_heads,
        intermediate_size=4 * hidden if intermediate is None else intermediate,
        max_position_embeddings=seq,
        **hf_config,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    ids: torch.Tensor,
    grid: Any = None,
    *,
    max_norm: float = 1.0,
    autocast: bool = False,
) -> torch.Tensor:
    """One next-token training step on `ids` (batch, seq): forward, mean cross-entropy, backward, gradient sync
    and clipping (the engine's on `grid`, torch's without one), optimizer step. Returns the loss (detached).

    autocast=True runs the forward under bf16 torch.autocast (fp32 weights), as `goldfish train --precision bf16`.
    """
    with torch.autocast(device_type=ids.device.type, dtype=torch.bfloat16, enabled=autocast):
        logits = model(input_ids=ids).logits
    loss = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    if grid is not None:
        engine.sync_gradients(model, grid)
        engine.clip_grad_norm_(model, max_norm, grid)
    else:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def _synchronize(device: torch.device | str | None) -> None:
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], T], device: torch.device | str | None = None) -> tuple[T, float]:
    """(fn(), its wall-clock seconds); on a CUDA `device` the queued kernels are waited for before and after."""
    _synchronize(device)
    start = time.perf_counter()
    result = fn()
    _synchronize(device)
    return result, time.perf_counter() - start


def repeat_seconds(fn: Callable[[], object], n: int, device: torch.device | str | None = None) -> list[float]:
    """The seconds of each of `n` calls of fn."""
    return [timed(fn, device)[1] for _ in range(n)]


def median_seconds(fn: Callable[[], object], repeats: int, warmup: int = 2) -> float:
    """Median seconds of `repeats` calls of fn after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    return statistics.median(repeat_seconds(fn, repeats))


def slowest_rank_seconds(fn: Callable[[], T], device: torch.device | str | None = None) -> tuple[T, float]:
    """(fn(), the seconds of the slowest rank of the default process group): all ranks start together after a
    barrier, and the step takes as long as its last rank."""
    dist.barrier()
    result, seconds = timed(fn, device)
    elapsed = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return result, float(elapsed)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now, for the rendezvous of spawned ranks."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_result(path: str | Path, result: dict[str, Any], argv: list[str] | None = None) -> Path:
    """Write `result` as strict JSON to `path` (atomically, data/atomic.py), preceded by the command line that
    produced it ("command": the script and `argv`, default sys.argv[1:])."""
    command = shlex.join([sys.argv[0], *(sys.argv[1:] if argv is None else argv)])
    return write_json_atomic(path, {"command": command, **result})
