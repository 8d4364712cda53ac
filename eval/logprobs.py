"""Teacher-forced token log-probabilities: the raw material of membership inference and probabilistic extraction.

One forward pass per batch of sequences; the log-probability of every token given all tokens before it.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import torch

from eval.batching import evaluating, model_device, pad_batch


def iter_next_token_logits(
    model: torch.nn.Module,
    sequences: Sequence[Sequence[int]],
    *,
    pad_token_id: int,
    batch_size: int = 8,
) -> Iterator[torch.Tensor]:
    """Teacher-forced logits of each sequence in order: a (T_i - 1, V) float32 CPU tensor whose row j scores the
    token at position j + 1 given tokens 0..j.

    A generator, so a caller reduces each sequence's logits before the next batch is computed (the logits of a
    whole evaluation set of a 49k-vocabulary model do not fit in memory). Sequences are right-padded into
    batches; with causal attention padding after a sequence does not change its logits. Each sequence needs at
    least 2 tokens (one to condition on, one to score).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    for i, seq in enumerate(sequences):
        if len(seq) < 2:
            raise ValueError(f"sequence {i} has {len(seq)} token(s); scoring needs at least 2 (a context and a target)")
    device = model_device(model)
    with evaluating(model):
        for start in range(0, len(sequences), batch_size):
            batch = [[int(t) for t in seq] for seq in sequences[start : start + batch_size]]
            input_ids, mask = pad_batch(batch, pad_token_id, side="right")
            logits = model(input_ids=input_ids.to(device), attention_mask=mask.to(device)).logits  # (B, W, V)
            for i, seq in enumerate(batch):
                yield logits[i, : len(seq) - 1].float().cpu()


def token_log_probs(
    model: torch.nn.Module,
    sequences: Sequence[Sequence[int]],
    *,
    pad_token_id: int,
    batch_size: int = 8,
) -> list[torch.Tensor]:
    """Log-probability (natural log) of each token given its predecessors, at temperature 1.

    Returns one (T_i - 1,) float64 CPU tensor per sequence: entry j = log p(token j+1 | tokens 0..j). The first
    token has no entry (nothing predicts it). The mean of -entries is the sequence's loss in nats per token.
    """
    out = []
    logits_iter = iter_next_token_logits(model, sequences, pad_token_id=pad_token_id, batch_size=batch_size)
    for seq, logits in zip(sequences, logits_iter):
        targets = torch.tensor([int(t) for t in seq[1:]], dtype=torch.long)  # (T-1,)
        log_probs = torch.log_softmax(logits.double(), dim=-1)  # (T-1, V)
        out.append(log_probs.gather(1, targets[:, None])[:, 0])
    return out


def next_token_stats(
    model: torch.nn.Module,
    sequences: Sequence[Sequence[int]],
    *,
    pad_token_id: int,
    batch_size: int = 8,
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per sequence, three (T_i - 1,) float64 CPU tensors from one teacher-forced pass: the token log-probabilities
    (as `token_log_probs`), and the mean and standard deviation of log p(z) over z drawn from the model's
    next-token distribution at each position (mu_t = sum_z p(z) log p(z), the negative entropy in nats;
    sigma_t = sqrt(sum_z p(z) (log p(z) - mu_t)^2)), the calibration of Min-K%++."""
    out = []
    logits_iter = iter_next_token_logits(model, sequences, pad_token_id=pad_token_id, batch_size=batch_size)
    for seq, logits in zip(sequences, logits_iter):
        targets = torch.tensor([int(t) for t in seq[1:]], dtype=torch.long)  # (T-1,)
        log_probs = torch.log_softmax(logits.double(), dim=-1)  # (T-1, V)
        probs = log_probs.exp()
        # p * log p is 0 where p underflows to 0 (log p is finite from log_softmax unless a logit is -inf)
        weighted = torch.where(probs > 0, probs * log_probs, torch.zeros_like(probs))
        mean = weighted.sum(-1)  # (T-1,)
        centered = torch.where(probs > 0, probs * (log_probs - mean[:, None]).square(), torch.zeros_like(probs))
        out.append((log_probs.gather(1, targets[:, None])[:, 0], mean, centered.sum(-1).sqrt()))
    return out
