"""Greedy decoding with a KV cache: batched, left-padded, prompts fed through the cache in bounded chunks.

Two entry points:
  * ``greedy_paths`` / ``greedy_decode`` continue prompts for a fixed number of tokens;
  * ``forced_greedy`` serves extraction, where each prompt's true continuation is known: one teacher-forced pass
    over the whole documents gives every position's prediction (for teacher-forced metrics) and the greedy path
    as far as it follows the true text; only the steps after a batch's first departure are decoded.

Left padding with explicit position ids makes every padded row see exactly the positions an unpadded run sees, so
the ids equal batch-size-1 decoding and HF ``generate(do_sample=False)``, up to float rounding on a near-tie (each
path records its smallest top-1 vs top-2 logit margin).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from transformers import PreTrainedModel, StaticCache

from engine.models.adapter import cache_keyword, returned_cache
from engine.models.layout import parallel_grid
from eval.batching import decode_longest_first, evaluating, left_pad, model_device, prefix_aligned

# Tokens (rows x columns) per forward while a prompt goes through the KV cache. Feeding it in column chunks bounds
# a forward's activations and logits whatever the batch and the document length (the (B, W, V) logits of a whole
# batch of 2048-token documents over a 50k vocabulary would be 13 GB at 32 rows). On CPU it is also faster: the
# tensors of a chunk are reused by the allocator instead of being mapped afresh for every op. Measured with the
# model of bench/extraction.py at one thread: a 206-token prompt costs 24-26 ms per row in chunks of 4096 tokens
# at 32 and 64 rows, against 27 and 36 ms in one forward.
PREFILL_TOKENS = 4096


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


def static_cache_fits(model: torch.nn.Module) -> bool:
    """Whether greedy decoding may give `model` a preallocated (static) KV cache: a plain Hugging Face model. A model
    whose decoder the engine parallelized (its layers hold a slice of the heads, as its recorded layout says) or a
    wrapper around one keeps the dynamic cache it creates itself."""
    if not isinstance(model, PreTrainedModel) or not getattr(model, "_supports_static_cache", True):
        return False
    return parallel_grid(model) is None


def _new_cache(model: torch.nn.Module, n_columns: int) -> StaticCache | None:
    """A static KV cache of `n_columns` for a plain HF model, allocated once: a dynamic cache concatenates every
    layer's keys and values at every step (copying the whole cache, B x heads x L x head_dim per layer and step).
    Masked cache slots get zero attention weight, so the ids equal the dynamic cache's. None for other models (they
    create their own cache)."""
    return StaticCache(config=model.config, max_cache_len=n_columns) if static_cache_fits(model) else None


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
    cache: StaticCache | None,
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
    for start in range(0, width, columns):
        end = min(start + columns, width)
        out = model(
            input_ids=input_ids[:, start:end],
            attention_mask=mask[:, :end],
            position_ids=position_ids[:, start:end],
            **{keyword: cache},
            use_cache=True,
            **({} if all_logits else {"logits_to_keep": 1}),
            **({"cache_position": torch.arange(start, end, device=input_ids.device)} if cache is not None else {}),
        )
        if not isinstance(cache, StaticCache):
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
    static = isinstance(cache, StaticCache)
    keyword = cache_keyword(model)
    full_mask = torch.cat([mask, mask.new_ones((n_rows, n_steps - first))], dim=1)  # built once, sliced per step
    for k, step in enumerate(range(first, n_steps)):
        column = width + k
        out = model(
            input_ids=generated[:, step - 1 : step],
            attention_mask=full_mask[:, : column + 1],
            position_ids=first_position + step - 1,
            **{keyword: cache},
            use_cache=True,
            logits_to_keep=1,
            **({"cache_position": torch.tensor([column], device=generated.device)} if static else {}),
        )
        if not static:
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
