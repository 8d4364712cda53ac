"""Greedy decoding with a KV cache: batched, left-padded, prompts fed through the cache in bounded chunks.

Two entry points:
  * ``greedy_paths`` / ``greedy_decode`` continue prompts for a fixed number of tokens;
  * ``forced_greedy`` serves extraction, where each prompt's true continuation is known: one teacher-forced pass
    over the whole documents gives every position's prediction (for teacher-forced metrics) and the greedy path
    as far as it follows the true text; only the steps after a batch's first departure are decoded.

Left padding with explicit position ids makes every padded row see exactly the positions an unpadded run sees, so
the ids equal batch-size-1 decoding and HF ``generate(do_sample=False)``, up to float rounding on a near-tie (each
path records its smallest top-1 vs top-2 logit margin).

Plain Hugging Face models get a KV cache allocated once per batch (`_PreallocatedLayer`) and, on CPUs where torch's
GEMM is slow (`ONEDNN_LINEARS`), their large float32 matmuls run on oneDNN (`onednn_linears`).
"""

from __future__ import annotations

import contextlib
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from engine.models.adapter import cache_keyword, returned_cache
from engine.models.layout import parallel_grid
from eval.batching import decode_longest_first, evaluating, left_pad, model_device, prefix_aligned

# Tokens (rows x columns) per forward while a prompt goes through the KV cache. Feeding it in column chunks bounds
# a forward's activations and logits whatever the batch and the document length (the (B, W, V) logits of a whole
# batch of 2048-token documents over a 50k vocabulary would be 13 GB at 32 rows). On CPU it is also faster: a chunk's
# activations stay in cache and the allocator reuses its tensors instead of mapping fresh memory for every op.
# Measured with the model of bench/extraction.py at one thread, two batches of 32 prompts of 206 tokens and 50 new
# tokens (CPU seconds, medians of 7): greedy_decode 1.69 at 2048 against 1.89 at 4096, forced_greedy 2.14 against
# 2.45; prompts of 78-206 tokens 1.64 and 2.22 either way.
PREFILL_TOKENS = 2048


def _cpu_vendor() -> str:
    """The x86 vendor string of this machine's CPU ("AuthenticAMD", "GenuineIntel"), or "" where unknown."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("vendor_id"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return next((v for v in ("AuthenticAMD", "GenuineIntel") if v in platform.processor()), "")


def _onednn_beats_torch_gemm() -> bool:
    """Whether torch's float32 CPU GEMM is MKL on an AMD CPU, where oneDNN's is about twice as fast.

    MKL picks its AVX2 code on non-Intel CPUs while oneDNN dispatches on the instruction set: on the AMD EPYC
    (AVX-512) of bench/extraction.py, one thread, 2.0-2.2x at 32 rows (the decoding steps) and 2.3x at 6,592 rows
    (the prompt pass) for 256 x 1024 weights, 1.3x even at one row for 2048 x 5632. Intel CPUs keep MKL: on the
    Intel Xeon of the H200 machine oneDNN was 0.42-1.15x MKL for the same shapes
    (bench/results/extraction_intel_xeon_1thread.txt).
    """
    return (
        torch.backends.mkl.is_available()
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
        and _cpu_vendor() == "AuthenticAMD"
    )


# Whether `onednn_linears` sends large float32 linear layers to oneDNN (decided once per process; tests and
# bench/extraction.py set it to compare both paths).
ONEDNN_LINEARS = _onednn_beats_torch_gemm()
# Multiply-adds (rows x in x out) from which a linear layer goes to oneDNN: below it oneDNN's fixed cost loses to MKL
# (256 x 256 weights: 0.98x at 8 rows, 1.29x at 16; a single row of a 256 x 1024 weight 0.69x).
ONEDNN_MIN_MACS = 1 << 20


def _onednn_fits(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether x @ weight.T + bias may run on oneDNN: plain float32 CPU tensors without autograd, x with at least two
    dims, weight (out, in), bias (out,) or None, and at least ONEDNN_MIN_MACS multiply-adds."""
    tensors = (x, weight) if bias is None else (x, weight, bias)
    if any(
        type(t) not in (torch.Tensor, torch.nn.Parameter) or t.device.type != "cpu" or t.dtype != torch.float32
        for t in tensors
    ):
        return False
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return False
    if x.dim() < 2 or weight.dim() != 2 or x.shape[-1] != weight.shape[1]:
        return False
    if bias is not None and bias.shape != weight.shape[:1]:
        return False
    return x.numel() * weight.shape[0] >= ONEDNN_MIN_MACS


class _OneDNNLinears(TorchFunctionMode):
    """Runs ``F.linear`` (nn.Linear: Llama and most families) and ``torch.addmm(bias, x, weight)`` (GPT-2's Conv1D,
    weight (in, out)) on oneDNN where `_onednn_fits`; every other call, and those that do not fit, run unchanged.
    The same products summed in another order: logits move by float32 rounding (~1e-5 relative)."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is F.linear and len(args) >= 2 and set(kwargs) <= {"bias"}:
            x, weight = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
        elif func is torch.addmm and len(args) == 3 and not kwargs and args[0].dim() == 1:
            bias, x, weight = args[0], args[1], args[2].t()
        else:
            return func(*args, **kwargs)
        if not _onednn_fits(x, weight, bias):
            return func(*args, **kwargs)
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def onednn_linears(model: torch.nn.Module, device: torch.device) -> Callable[[int], contextlib.AbstractContextManager]:
    """A function of a forward's tokens (rows x columns) giving the context to run that forward of `model` in.

    `_OneDNNLinears` (the large float32 linear layers on oneDNN) when ONEDNN_LINEARS is set, `device` is the CPU,
    the model is a plain Hugging Face model (`preallocated_cache_fits`) and its largest weight times the tokens
    reaches ONEDNN_MIN_MACS; a no-op context otherwise. Nothing of the model changes: torch's function calls are
    rerouted while the context is open. The routing costs every torch call a Python hop (a fifth of a batch-1
    decoding step of bench/extraction.py's model), hence not entered where no layer could fit.
    """
    if not (ONEDNN_LINEARS and device.type == "cpu" and preallocated_cache_fits(model)):
        return lambda n_tokens: contextlib.nullcontext()
    largest = max((p.numel() for p in model.parameters() if p.dim() == 2), default=0)  # a weight's in x out

    def context(n_tokens: int) -> contextlib.AbstractContextManager:
        fits = largest > 0 and n_tokens * largest >= ONEDNN_MIN_MACS
        return _OneDNNLinears() if fits else contextlib.nullcontext()

    return context


@dataclass(frozen=True)
class GreedyPath:
    """One greedy continuation and how close it came to a tie.

    ids: the generated ids. min_margin: the smallest top-1 minus top-2 logit (in the model's logit units,
    computed in float32) over the generated positions; None when the vocabulary has a single entry.
    min_margin_position: the 0-based generated position where it occurs (the first, on equal margins).
    A greedy id whose margin is within float rounding of 0 can flip between batch sizes, devices or
    kernels without any real difference in the model.
    logprob_mean: the mean natural-log probability the model gave its own generated ids (log-softmax of the logits
    at temperature 1, float32): how confident the model is in the continuation.
    reference_logprob_mean: the mean log-probability of the TRUE continuation's ids, teacher-forced after the
    prefix (``forced_greedy`` only, which knows the true continuation; None elsewhere).
    """

    ids: list[int]
    min_margin: float | None
    min_margin_position: int | None
    logprob_mean: float | None = None
    reference_logprob_mean: float | None = None


def preallocated_cache_fits(model: torch.nn.Module) -> bool:
    """Whether greedy decoding may give `model` a KV cache allocated once and run its matmuls on oneDNN: a plain
    Hugging Face model. A model whose decoder the engine parallelized (its layers hold a slice of the heads, as its
    recorded layout says) or a wrapper around one keeps the dynamic cache it creates itself, and torch's GEMM."""
    return isinstance(model, PreTrainedModel) and parallel_grid(model) is None


class _PreallocatedLayer(DynamicLayer):
    """A dynamic cache layer whose keys and values are views of buffers allocated once for `capacity` columns.

    HF's DynamicLayer concatenates at every step (copying the layer's whole cache), and its StaticLayer attends over
    all of its columns, filled or not: a one-token step reads the whole KV cache from memory, so the unfilled columns
    cost as much as the filled ones. Here a step writes its column in place and attends over the filled columns only.
    """

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device, self.dtype = key_states.device, key_states.dtype
        self._key_buffer = key_states.new_empty((*key_states.shape[:-2], self.capacity, key_states.shape[-1]))
        self._value_buffer = value_states.new_empty((*value_states.shape[:-2], self.capacity, value_states.shape[-1]))
        self.keys, self.values = self._key_buffer[..., :0, :], self._value_buffer[..., :0, :]
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self.keys.shape[-2]
        end = start + key_states.shape[-2]
        if end > self.capacity:
            raise RuntimeError(f"KV cache layer of {self.capacity} columns cannot take {end}")
        self._key_buffer[..., start:end, :] = key_states
        self._value_buffer[..., start:end, :] = value_states
        self.keys, self.values = self._key_buffer[..., :end, :], self._value_buffer[..., :end, :]
        return self.keys, self.values


def _new_cache(model: torch.nn.Module, n_columns: int) -> DynamicCache | None:
    """A KV cache of `n_columns` for a plain HF model, its full-attention layers allocated once (`_PreallocatedLayer`;
    sliding-window and other layers stay as transformers builds them). None for other models, which create their
    own cache."""
    if not preallocated_cache_fits(model):
        return None
    cache = DynamicCache(config=model.config)
    cache.layers = [_PreallocatedLayer(n_columns) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def _top2_margins(logits: torch.Tensor) -> torch.Tensor:
    """Top-1 minus top-2 logit along the last axis, in float32: (..., V) -> (...); zeros for a 1-entry vocabulary."""
    if logits.shape[-1] < 2:
        return logits.new_zeros(logits.shape[:-1], dtype=torch.float32)
    top2 = logits.float().topk(2, dim=-1).values
    return top2[..., 0] - top2[..., 1]


def _top_log_probs(logits: torch.Tensor) -> torch.Tensor:
    """Log-probability of the argmax id along the last axis, in float32: (..., V) -> (...) (max - logsumexp)."""
    logits = logits.float()
    return logits.max(dim=-1).values - torch.logsumexp(logits, dim=-1)


def _paths(
    generated: torch.Tensor,
    margins: torch.Tensor,
    log_probs: torch.Tensor,
    vocab: int,
    reference_log_probs: torch.Tensor | None = None,
) -> list[GreedyPath]:
    """One GreedyPath per row of generated ids (B, N), their top-2 margins (B, N) and log-probabilities (B, N), and
    optionally the true continuation's log-probabilities (B, N); no margin record for a vocabulary of one entry."""
    means = log_probs.double().mean(dim=-1).tolist()
    refs = [None] * len(means) if reference_log_probs is None else reference_log_probs.double().mean(dim=-1).tolist()
    if vocab < 2:
        return [GreedyPath(ids, None, None, lp, ref) for ids, lp, ref in zip(generated.tolist(), means, refs)]
    smallest, where = margins.min(dim=-1)  # (B,), first position on ties
    return [
        GreedyPath(ids, float(m), int(p), lp, ref)
        for ids, m, p, lp, ref in zip(generated.tolist(), smallest.tolist(), where.tolist(), means, refs)
    ]


def _prefill(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    mask: torch.Tensor,
    position_ids: torch.Tensor,
    cache: DynamicCache | None,
    on_logits: Callable[[int, torch.Tensor], None],
    *,
    all_logits: bool,
) -> Any:
    """Feed (B, W) tokens through the KV cache in column chunks of about PREFILL_TOKENS tokens.

    mask: (B, W) attention mask, position_ids: (B, W). ``on_logits(start, logits)`` receives each chunk's logits:
    (B, c, V) for its columns start .. start + c - 1 with ``all_logits``, else its last column's only (B, 1, V).
    Returns the cache (``cache`` itself, or the one the model created when ``cache`` is None).
    """
    n_rows, width = input_ids.shape
    columns = max(1, PREFILL_TOKENS // n_rows)
    keyword = cache_keyword(model)
    linears = onednn_linears(model, input_ids.device)
    for start in range(0, width, columns):
        end = min(start + columns, width)
        with linears(n_rows * (end - start)):
            out = model(
                input_ids=input_ids[:, start:end],
                attention_mask=mask[:, :end],
                position_ids=position_ids[:, start:end],
                **{keyword: cache},
                use_cache=True,
                **({} if all_logits else {"logits_to_keep": 1}),
            )
        cache = returned_cache(out)
        on_logits(start, out.logits)
    return cache


def _decode(
    model: torch.nn.Module,
    cache: Any,
    generated: torch.Tensor,
    margins: torch.Tensor,
    log_probs: torch.Tensor,
    known_through: torch.Tensor,
    mask: torch.Tensor,
    first_position: torch.Tensor,
) -> None:
    """Extend greedy paths one token per step, in place, on a cache holding W columns.

    generated, margins, log_probs: (B, S) ids, top-2 margins and the ids' log-probabilities; row i's entries at
    steps <= known_through[i] (B,) are known and kept, the others are filled in. mask: (B, W), the columns of the
    cache on each row's path (0 elsewhere: left padding, tokens off the path). first_position: (B, 1), the position
    id of step 0. Every row is fed its own previous id at each step (rows decode in lockstep from the smallest
    known_through + 1); tokens are appended after the W columns, with the position ids they have in the greedy
    sequence.
    """
    n_rows, n_steps = generated.shape
    width = mask.shape[1]
    first = int(known_through.min()) + 1
    if first >= n_steps:
        return
    keyword = cache_keyword(model)
    linears = onednn_linears(model, generated.device)(n_rows)  # entered afresh for every step
    full_mask = torch.cat([mask, mask.new_ones((n_rows, n_steps - first))], dim=1)  # built once, sliced per step
    for k, step in enumerate(range(first, n_steps)):
        column = width + k
        with linears:
            out = model(
                input_ids=generated[:, step - 1 : step],
                attention_mask=full_mask[:, : column + 1],
                position_ids=first_position + step - 1,
                **{keyword: cache},
                use_cache=True,
                logits_to_keep=1,
            )
        cache = returned_cache(out)
        logits = out.logits[:, -1, :]  # (B, V)
        fresh = known_through < step  # rows whose id at this step is not known yet
        generated[:, step] = torch.where(fresh, logits.argmax(dim=-1), generated[:, step])
        margins[:, step] = torch.where(fresh, _top2_margins(logits), margins[:, step])
        log_probs[:, step] = torch.where(fresh, _top_log_probs(logits), log_probs[:, step])


def _greedy_batch(
    model: torch.nn.Module, rows: list[list[int]], max_new_tokens: int, pad_token_id: int, device: torch.device
) -> list[GreedyPath]:
    """Greedy continuation of one batch of prompts: one GreedyPath per row (max_new_tokens ids each)."""
    input_ids, mask, position_ids = left_pad(rows, pad_token_id, device)
    n_rows, prompt_len = input_ids.shape
    last: list[torch.Tensor] = []
    cache = _prefill(
        model,
        input_ids,
        mask,
        position_ids,
        _new_cache(model, prompt_len + max_new_tokens - 1),
        lambda _, logits: last.append(logits[:, -1, :]),
        all_logits=False,
    )
    logits = last[-1]  # (B, V): the prediction after each whole prompt
    generated = torch.zeros((n_rows, max_new_tokens), dtype=torch.long, device=device)
    margins = torch.zeros((n_rows, max_new_tokens), dtype=torch.float32, device=device)
    log_probs = torch.zeros((n_rows, max_new_tokens), dtype=torch.float32, device=device)
    generated[:, 0], margins[:, 0], log_probs[:, 0] = logits.argmax(-1), _top2_margins(logits), _top_log_probs(logits)
    known = torch.zeros(n_rows, dtype=torch.long, device=device)  # step 0 is known for every row
    _decode(model, cache, generated, margins, log_probs, known, mask, position_ids[:, -1:] + 1)
    return _paths(generated, margins, log_probs, logits.shape[-1])


def greedy_paths(
    model: torch.nn.Module,
    prefixes: list[list[int]],
    max_new_tokens: int,
    *,
    pad_token_id: int,
    batch_size: int = 32,
    device: torch.device | str | None = None,
) -> list[GreedyPath]:
    """`greedy_decode`, with each continuation's near-tie record (`GreedyPath`), in the input order."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    for i, p in enumerate(prefixes):
        if len(p) == 0:
            raise ValueError(f"prefix {i} is empty; greedy decoding needs at least one prompt token")
    device = torch.device(device) if device is not None else model_device(model)

    with evaluating(model):
        return decode_longest_first(
            prefixes, batch_size, lambda rows: _greedy_batch(model, rows, max_new_tokens, pad_token_id, device)
        )


def greedy_decode(
    model: torch.nn.Module,
    prefixes: list[list[int]],
    max_new_tokens: int,
    *,
    pad_token_id: int,
    batch_size: int = 32,
    device: torch.device | str | None = None,
) -> list[list[int]]:
    """Greedy continuations of ``prefixes``, exactly ``max_new_tokens`` ids each, in the input order.

    Batched with a KV cache and left padding; on CPU equal to batch-size-1 decoding and to HF
    ``generate(do_sample=False)`` without an EOS stop (an early EOS is just another generated id). On GPUs,
    float rounding depends on the batch's shape, so an id whose top-2 logits are within rounding can differ
    (`greedy_paths` records each continuation's smallest margin). Prefixes are decoded longest first so
    similar lengths share a batch (less padding) and the biggest batch runs first (an out-of-memory error
    shows up at once). ``device`` defaults to the model's.
    """
    return [
        path.ids
        for path in greedy_paths(
            model, prefixes, max_new_tokens, pad_token_id=pad_token_id, batch_size=batch_size, device=device
        )
    ]


def forced_greedy(
    model: torch.nn.Module,
    docs: list[list[int]],
    prefix_lens: list[int],
    suffix_len: int,
    *,
    pad_token_id: int,
    device: torch.device,
) -> tuple[list[GreedyPath], list[torch.Tensor]]:
    """Greedy continuation of each document's prefix AND its teacher-forced predictions, from one shared pass.

    docs[i] is a document of T_i tokens; its prefix is the first prefix_lens[i] = P_i tokens and its true suffix
    the next `suffix_len` = S (T_i >= P_i + S). Returns (paths, predicted): the greedy path of S ids after each
    prefix (with the mean log-probability of its own ids and of the true suffix's ids, the latter read off the
    teacher-forced logits at the suffix positions), and each document's teacher-forced argmax predictions, a (T_i,)
    int64 tensor whose entry j is the model's prediction for token j + 1 given tokens 0..j.

    One pass over prefix + suffix gives the teacher-forced logits, and with them the greedy path as far as it
    follows the true suffix: while the greedy id equals the true next token, the greedy context IS the document, so
    the id at step j is the argmax of the forced logits at the prefix's end + j. Row i's path is read off up to and
    including its first mismatch m_i; only the steps after the batch's smallest m_i are decoded, on the KV cache of
    that same pass (its columns from there on masked out, not cut: HF caches do not offer cutting alike across
    versions). A batch of memorized documents decodes nothing, and the tokens go through the model once instead of
    twice (decoding, then teacher forcing). The ids equal `greedy_paths` from the prefixes up to float rounding on a
    near-tie (the margins record it).

    Documents longer than prefix + suffix (the Pythia split) get their predictions from a second pass over the
    whole documents instead, so that decoding attends over prefix + suffix + S columns, not the whole documents.
    Runs on the model as it is (call inside `evaluating`).
    """
    s = suffix_len
    lp = max(prefix_lens)  # every prefix ends at column lp - 1
    windows = [d[: p + s] for d, p in zip(docs, prefix_lens)]
    input_ids, mask, position_ids, starts = prefix_aligned(windows, prefix_lens, pad_token_id, device)
    n_rows, width = input_ids.shape  # width = lp + S

    predicted = torch.zeros((n_rows, width), dtype=torch.long, device=device)  # argmax at every column
    margins = torch.zeros((n_rows, s), dtype=torch.float32, device=device)  # at the suffix steps
    top_log_probs = torch.zeros((n_rows, s), dtype=torch.float32, device=device)  # of the forced argmax ids
    true_log_probs = torch.zeros((n_rows, s), dtype=torch.float32, device=device)  # of the true suffix ids
    vocab: list[int] = []

    def keep(start: int, logits: torch.Tensor) -> None:  # logits (B, c, V) of columns start .. start + c - 1
        end = start + logits.shape[1]
        predicted[:, start:end] = logits.argmax(dim=-1)
        low, high = max(start, lp - 1), min(end, lp - 1 + s)  # suffix steps j sit at columns lp - 1 + j
        if low < high:
            steps = slice(low - lp + 1, high - lp + 1)
            at_suffix = logits[:, low - start : high - start].float()  # (B, h, V)
            margins[:, steps] = _top2_margins(at_suffix)
            norm = torch.logsumexp(at_suffix, dim=-1)  # (B, h)
            top_log_probs[:, steps] = at_suffix.max(dim=-1).values - norm
            true_ids = input_ids[:, low + 1 : high + 1]  # column c predicts the token at column c + 1
            true_log_probs[:, steps] = at_suffix.gather(-1, true_ids[..., None])[..., 0] - norm
        vocab.append(logits.shape[-1])

    cache = _prefill(model, input_ids, mask, position_ids, _new_cache(model, width + s - 1), keep, all_logits=True)

    suffix = input_ids[:, lp : lp + s]  # (B, S)
    generated = predicted[:, lp - 1 : lp - 1 + s].clone()  # (B, S): the forced argmax at each suffix step
    mismatch = generated != suffix
    first_miss = torch.where(mismatch.any(dim=1), mismatch.int().argmax(dim=1), s)  # (B,): m_i, S when none
    steps = torch.arange(s, device=device)
    generated = torch.where(steps[None, :] < first_miss[:, None], suffix, generated)  # true ids before m_i
    # Up to and including m_i the greedy id is the forced argmax, so its log-probability is the forced pass's.
    log_probs = top_log_probs
    path_mask = mask.clone()
    path_mask[:, lp + int(first_miss.min()) :] = 0  # columns past the batch's first mismatch are off some path
    _decode(model, cache, generated, margins, log_probs, first_miss, path_mask, position_ids[:, lp - 1 : lp] + 1)
    del cache
    paths = _paths(generated, margins, log_probs, vocab[-1], true_log_probs)

    if any(len(d) > len(w) for d, w in zip(docs, windows)):
        input_ids, mask, position_ids, starts = prefix_aligned(docs, prefix_lens, pad_token_id, device)
        predicted = torch.zeros_like(input_ids)

        def keep_ids(start: int, logits: torch.Tensor) -> None:
            predicted[:, start : start + logits.shape[1]] = logits.argmax(dim=-1)

        full_width = input_ids.shape[1]
        _prefill(model, input_ids, mask, position_ids, _new_cache(model, full_width), keep_ids, all_logits=True)
    return paths, [predicted[i, start : start + len(d)] for i, (d, start) in enumerate(zip(docs, starts))]
