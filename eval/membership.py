"""Membership inference: does a model's behaviour on a document reveal that the document was trained on?

Each attack turns a document's teacher-forced token log-probabilities into one score; every score is ORIENTED SO
THAT HIGHER MEANS "MEMBER" (more likely a training document). With members = training documents and non-members =
held-out documents of the same source, an attack's quality is the ROC of its scores: AUC, and the true-positive
rate at a low false-positive rate (1% and 0.1%), the figure of merit of Carlini et al. 2022 ("Membership inference
attacks from first principles").

Attacks (loss = mean negative log-likelihood of the document's tokens, in nats per token; the first token of a
document is conditioned on, never scored):
  * ``loss``:      -loss (Yeom et al. 2018). Members have lower loss.
  * ``zlib``:      -loss / zlib_bytes, where zlib_bytes = len(zlib.compress(text.encode("utf-8"))) at zlib's
                   default level, text = the decoded tokens that were scored. Carlini et al. 2021 ("Extracting
                   training data from large language models") rank samples by the ratio of the model's
                   log-perplexity to the text's zlib entropy, low ratio = memorized; mimir computes the same ratio
                   (loss / compressed byte length). We negate it so higher = member. Texts that compress well
                   (repetitive, hence low loss anyway) are penalised; the absolute scale is meaningless.
  * ``min_k``:     mean of the lowest k-fraction of the token log-probabilities (Shi et al. 2024, "Detecting
                   pretraining data from large language models", Min-K% Prob). The number of tokens averaged is
                   floor(k * n), at least 1, over the n scored tokens. Members have few very unlikely tokens.
  * ``reference``: reference_loss - loss, the log of the ratio of the reference model's perplexity to the target's
                   (Carlini et al. 2021's comparison with another model; mimir's reference attack). The reference is
                   a model that never saw the documents, e.g. the untrained control: it calibrates away how easy a
                   text is in general. Only present when reference log-probabilities are given.
  * ``min_k_pp``:  Min-K%++ (Zhang et al., ICLR 2025, "Min-K%++: improved baseline for detecting pre-training
                   data from large language models"). Each scored token t gets z_t = (log p(x_t | x_<t) - mu_t) /
                   sigma_t, where mu_t = E_{z ~ p(.|x_<t)}[log p(z | x_<t)] and sigma_t^2 = Var_{z ~ p(.|x_<t)}
                   [log p(z | x_<t)] are over the model's whole next-token distribution; the score is the mean of
                   the lowest floor(k * n) (at least 1) of the z_t, with the same k as Min-K%. A member's tokens
                   are local maxima of the distribution (z_t high). A token where sigma_t = 0 (one token has all
                   the mass) gets z_t = 0.
  * ``grad_norm``: -||grad_theta L(x)||_2, the Euclidean norm of the gradient of the document's mean token loss
                   with respect to every weight, negated: training drives the gradient of a member towards 0 (the
                   gradient-norm signal of Nasr et al. 2019, "Comprehensive privacy analysis of deep learning",
                   used on LLMs by e.g. Maini et al. 2024, "LLM dataset inference"). One backward pass per document.
  * ``recall``:    ReCaLL (Xie et al. 2024, "ReCaLL: membership inference via relative conditional
                   log-likelihoods"): LL(x | P) / LL(x), with LL the mean token log-likelihood (negative) of the
                   same tokens of x, unconditioned and with a non-member prefix P prepended. Conditioning a member
                   on non-member text lowers its log-likelihood more than a non-member's (the paper's finding), so
                   the ratio is larger for members. P is built from held-out documents (`recall_prefix`) whose own
                   rows then carry no ReCaLL score: the attack is not scored on the documents it uses.
  * ``dc_pdd``:    DC-PDD (Zhang et al. 2024, "Pretraining data detection for large language models: a
                   divergence-based calibration method"), as its authors' code and mimir compute it: for the first
                   occurrence of every distinct token id of x, alpha_t = p_t * log(1 / f(x_t)) with p_t = p(x_t |
                   x_<t) the model's probability and f the token's frequency in a reference corpus (add-one smoothed
                   counts over the tokenizer's vocabulary, `token_frequencies`): the token's term of the cross-entropy
                   between the model's probabilities and the corpus frequencies, always >= 0. alpha_t is capped at
                   ``DC_PDD_CAP`` and the score is the mean of the capped alpha_t. A member's tokens are likely to
                   the model, and the rare ones (large log(1 / f)) weigh most.
"""

from __future__ import annotations

import math
import zlib
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
from sklearn.metrics import roc_auc_score, roc_curve

from eval.batching import evaluating, model_device
from eval.intervals import BOOTSTRAP_SEED, DEFAULT_CONFIDENCE, DEFAULT_RESAMPLES, auc_interval
from eval.logprobs import next_token_stats, token_log_probs
from eval.metrics import AUC, AUC_CI, TPR_AT_FPR
from eval.roc import tpr_at_fpr

ATTACKS = ("loss", "zlib", "min_k", "reference", "min_k_pp", "grad_norm", "recall", "dc_pdd")
DEFAULT_MIN_K = 0.2
DEFAULT_TARGET_FPRS = (0.01, 0.001)
DC_PDD_CAP = 0.01  # the cap "a" on each token's alpha (a hyperparameter of the paper): no token dominates
DEFAULT_RECALL_PREFIX_DOCS = 1  # held-out documents that make ReCaLL's non-member prefix


def zlib_bytes(text: str) -> int:
    """Length in bytes of the zlib-compressed (default level 6) UTF-8 encoding of ``text``."""
    return len(zlib.compress(text.encode("utf-8")))


def min_k_count(n_tokens: int, k: float) -> int:
    """How many of ``n_tokens`` scored tokens the Min-K% attack averages: floor(k * n), at least 1.

    A small epsilon absorbs float error in k * n (0.29 * 100 = 28.999999999999996 means 29).
    """
    if not 0 < k <= 1:
        raise ValueError(f"min_k must be a fraction in (0, 1], e.g. 0.2 for Min-20% Prob, got {k!r}")
    if n_tokens < 1:
        raise ValueError(f"Min-K% needs at least one scored token, got {n_tokens}")
    return max(1, math.floor(k * n_tokens + 1e-9))


def min_k_pp_score(log_probs: np.ndarray, mean_log_probs: np.ndarray, std_log_probs: np.ndarray, k: float) -> float:
    """Min-K%++ of one document: mean of the lowest floor(k * n) (at least 1) of z_t = (log_probs[t] -
    mean_log_probs[t]) / std_log_probs[t] (z_t = 0 where std is 0). All three are (n,) arrays over the scored
    tokens: the token's log-probability and the mean and standard deviation of log p(z) for z drawn from the
    model's next-token distribution at that position (see `next_token_stats`)."""
    lp, mu, sigma = (np.asarray(a, dtype=np.float64).reshape(-1) for a in (log_probs, mean_log_probs, std_log_probs))
    if not lp.shape == mu.shape == sigma.shape:
        raise ValueError(f"Min-K%++ needs one mean and std per token, got {lp.size}, {mu.size} and {sigma.size}")
    z = np.divide(lp - mu, sigma, out=np.zeros_like(lp), where=sigma > 0)
    return float(np.sort(z)[: min_k_count(lp.size, k)].mean())


def recall_score(log_probs: np.ndarray, conditional_log_probs: np.ndarray) -> float:
    """ReCaLL of one document: LL(x | P) / LL(x), the mean of ``conditional_log_probs`` (the tokens' log-probs
    with the non-member prefix P in front) over the mean of ``log_probs`` (the same tokens without it); both (n,).
    Higher = member. A document the model predicts perfectly (LL(x) = 0) has no ratio: raises."""
    lp = np.asarray(log_probs, dtype=np.float64).reshape(-1)
    cond = np.asarray(conditional_log_probs, dtype=np.float64).reshape(-1)
    if lp.shape != cond.shape or lp.size == 0:
        raise ValueError(
            f"ReCaLL compares the same tokens with and without the prefix: got {lp.size} and "
            f"{cond.size} log-probabilities"
        )
    unconditional = lp.mean()
    if unconditional == 0:
        raise ValueError("ReCaLL is undefined for a document of log-likelihood 0 (every token has probability 1)")
    return float(cond.mean() / unconditional)


def dc_pdd_score(
    log_probs: np.ndarray, token_ids: Sequence[int], frequencies: np.ndarray, cap: float = DC_PDD_CAP
) -> float:
    """DC-PDD of one document: mean over the first occurrence of each distinct id in ``token_ids`` (the scored
    tokens, (n,)) of min(p_t * log(1 / frequencies[id_t]), cap), with p_t = exp(log_probs[t]): the published form
    (Zhang et al. 2024's code, ``ce = x_pro * np.log(1 / x_fre)``, and mimir's). ``frequencies``: (V,)
    reference-corpus token frequencies, all in (0, 1] (`token_frequencies` smooths them)."""
    lp = np.asarray(log_probs, dtype=np.float64).reshape(-1)
    ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
    if ids.shape != lp.shape:
        raise ValueError(f"DC-PDD needs one token id per log-probability, got {ids.size} and {lp.size}")
    freq = np.asarray(frequencies, dtype=np.float64)
    if ids.max(initial=0) >= freq.size:
        raise ValueError(
            f"token id {int(ids.max())} is beyond the {freq.size} reference frequencies: count the "
            "frequencies with the model's tokenizer"
        )
    _, first = np.unique(ids, return_index=True)  # positions of first occurrences
    alpha = np.exp(lp[first]) * -np.log(freq[ids[first]])
    return float(np.minimum(alpha, cap).mean())


def token_frequencies(sequences: Sequence[Sequence[int]], vocab_size: int) -> np.ndarray:
    """(vocab_size,) add-one smoothed token frequencies of a reference text: (count(v) + 1) / (total + vocab_size),
    so a token the text never contains still has a finite log-frequency."""
    counts = np.zeros(int(vocab_size), dtype=np.float64)
    for seq in sequences:
        ids = np.asarray(seq, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
            raise ValueError(f"token id out of range [0, {vocab_size}) in the reference text")
        counts += np.bincount(ids, minlength=int(vocab_size))[: int(vocab_size)]
    return (counts + 1.0) / (counts.sum() + vocab_size)


def recall_prefix(nonmembers: Sequence[Any], n_docs: int = DEFAULT_RECALL_PREFIX_DOCS) -> tuple[list[int], list[str]]:
    """ReCaLL's non-member prefix: the token ids of the first ``n_docs`` held-out documents, concatenated, and
    those documents' ids (they are left out of the ReCaLL scores). Needs a held-out document left to score."""
    if n_docs < 1 or len(nonmembers) <= n_docs:
        raise ValueError(
            f"ReCaLL takes its prefix from {n_docs} held-out document(s) and must score at least one "
            f"more; got {len(nonmembers)} held-out document(s): select more with --n-heldout"
        )
    docs = list(nonmembers)[:n_docs]
    return [int(t) for doc in docs for t in doc.token_ids], [str(doc.id) for doc in docs]


def gradient_norm(model: torch.nn.Module, token_ids: Sequence[int]) -> float:
    """||grad_theta L||_2 of the mean next-token cross-entropy L of one sequence (every token after the first),
    over every floating-point parameter of ``model`` (whether or not it is trainable; the flags are restored). The
    model runs in eval mode (no dropout) and its ``.grad`` fields are left untouched (torch.autograd.grad)."""
    params = [p for p in model.parameters() if p.is_floating_point()]
    flags = [p.requires_grad for p in params]
    ids = torch.tensor([[int(t) for t in token_ids]], device=model_device(model))
    try:
        for p in params:
            p.requires_grad_(True)
        with evaluating(model), torch.enable_grad():
            logits = model(input_ids=ids).logits[0, :-1].float()  # (T-1, V)
            loss = torch.nn.functional.cross_entropy(logits, ids[0, 1:])
            grads = torch.autograd.grad(loss, params, allow_unused=True)
    finally:
        for p, flag in zip(params, flags):
            p.requires_grad_(flag)
    squares = sum(float(g.double().pow(2).sum()) for g in grads if g is not None)
    return math.sqrt(squares)


def membership_scores(
    log_probs: Sequence[float] | torch.Tensor | np.ndarray,
    text: str,
    *,
    min_k: float = DEFAULT_MIN_K,
    reference_log_probs: Sequence[float] | torch.Tensor | np.ndarray | None = None,
    mean_log_probs: Sequence[float] | torch.Tensor | np.ndarray | None = None,
    std_log_probs: Sequence[float] | torch.Tensor | np.ndarray | None = None,
    conditional_log_probs: Sequence[float] | torch.Tensor | np.ndarray | None = None,
    token_ids: Sequence[int] | None = None,
    frequencies: np.ndarray | None = None,
    grad_norm: float | None = None,
) -> dict[str, float | int]:
    """All attack scores of one document from its token log-probabilities (natural log, one per scored token).

    text: the text those tokens spell (for the zlib attack). reference_log_probs: the same tokens' log-probabilities
    under the reference model (same length), or None to leave out the reference attack. mean_log_probs and
    std_log_probs (n,): the next-token distribution's mean and standard deviation of log p (Min-K%++, left out when
    None). conditional_log_probs: the log-probabilities of the first m <= n scored tokens with ReCaLL's non-member
    prefix in front (ReCaLL compares them with the first m of ``log_probs``; left out when None). token_ids (n,) and
    frequencies (V,): the scored ids and the reference corpus's token frequencies (DC-PDD, left out when None).
    grad_norm: the gradient norm of the document's loss (`gradient_norm`), or None.

    Returns the raw quantities (``loss``, ``zlib_bytes``, ``min_k_mean_log_prob``, ``reference_loss``,
    ``grad_norm``, ``recall_loss``, ``n_scored``) and one ``score_<attack>`` per attack, each oriented so that
    higher means member.
    """
    lp = np.asarray(log_probs, dtype=np.float64).reshape(-1)
    if lp.size == 0:
        raise ValueError("no token log-probabilities: a document needs at least one scored token")
    if np.any(lp > 1e-9) or np.any(np.isnan(lp)):
        raise ValueError("log-probabilities must be <= 0 and not NaN; pass log p (e.g. from token_log_probs), not p")
    loss = float(-lp.mean())
    compressed = zlib_bytes(text)
    if compressed == 0:  # zlib always writes a header, so this guards only against a broken zlib
        raise ValueError("zlib-compressed length is 0")
    lowest = np.sort(lp)[: min_k_count(lp.size, min_k)]
    row: dict[str, float | int] = {
        "n_scored": int(lp.size),
        "loss": loss,
        "zlib_bytes": compressed,
        "min_k_mean_log_prob": float(lowest.mean()),
        "score_loss": -loss,
        "score_zlib": -loss / compressed,
        "score_min_k": float(lowest.mean()),
    }
    if reference_log_probs is not None:
        ref = np.asarray(reference_log_probs, dtype=np.float64).reshape(-1)
        if ref.shape != lp.shape:
            raise ValueError(
                f"reference_log_probs has {ref.size} entries but log_probs has {lp.size}: score the same "
                "tokens with both models (they must share the tokenizer)"
            )
        reference_loss = float(-ref.mean())
        row["reference_loss"] = reference_loss
        row["score_reference"] = reference_loss - loss
    if mean_log_probs is not None and std_log_probs is not None:
        row["score_min_k_pp"] = min_k_pp_score(lp, np.asarray(mean_log_probs), np.asarray(std_log_probs), min_k)
    if grad_norm is not None:
        row["grad_norm"] = float(grad_norm)
        row["score_grad_norm"] = -float(grad_norm)
    if conditional_log_probs is not None:
        cond = np.asarray(conditional_log_probs, dtype=np.float64).reshape(-1)
        if not 0 < cond.size <= lp.size:
            raise ValueError(f"ReCaLL scores the first m of the document's {lp.size} tokens, got m = {cond.size}")
        row["recall_n_scored"] = int(cond.size)
        row["recall_loss"] = float(-cond.mean())
        row["score_recall"] = recall_score(lp[: cond.size], cond)
    if token_ids is not None and frequencies is not None:
        row["score_dc_pdd"] = dc_pdd_score(lp, token_ids, frequencies)
    return row


def recall_window(n_tokens: int, n_prefix: int, context: int | None) -> tuple[int, int]:
    """(prefix tokens kept, document tokens scored) of ReCaLL for a document of ``n_tokens`` ids and a prefix of
    ``n_prefix`` ids in a model of ``context`` positions (None: unbounded). The whole document when it fits beside
    the prefix; otherwise the prefix keeps its last max(context - n_tokens, context // 2) ids and the document is cut
    to the rest of the context (both texts are then compared on the same shortened document)."""
    if context is None or n_prefix + n_tokens <= context:
        return n_prefix, n_tokens
    kept = min(n_prefix, max(context - n_tokens, context // 2))
    doc = min(n_tokens, context - kept)
    if doc < 2:
        raise ValueError(f"a context of {context} tokens leaves no room for ReCaLL's prefix and a document")
    return kept, doc


def membership_rows(
    model: torch.nn.Module,
    documents: Sequence[Any],
    *,
    decode: Callable[[list[int]], str],
    pad_token_id: int,
    reference_model: torch.nn.Module | None = None,
    min_k: float = DEFAULT_MIN_K,
    batch_size: int = 8,
    member: bool | None = None,
    recall_prefix_ids: Sequence[int] | None = None,
    frequencies: np.ndarray | None = None,
    grad_norm: bool = True,
    grad_norm_fn: Callable[[torch.nn.Module, list[int]], float] | None = None,
) -> list[dict[str, Any]]:
    """Per-document attack scores for ``documents`` (objects with ``.id`` and ``.token_ids``).

    Every token after the first is scored (the whole document, as in the attacks' papers); of a conversation
    (``.replies``, data.chat) only its replies' tokens, every attack alike (the gradient norm excepted: the whole
    conversation's loss). ``decode`` turns the
    scored ids into the text for zlib (skip special tokens there). ``reference_model`` must share the tokenizer.
    ``member`` (True for training documents, False for held-out ones) is copied into each row when given.
    One teacher-forced pass gives loss, zlib, Min-K% and Min-K%++; ``recall_prefix_ids`` (see `recall_prefix`)
    adds a pass with the prefix for ReCaLL, ``frequencies`` (see `token_frequencies`) adds DC-PDD, ``grad_norm``
    one backward pass per document (``grad_norm_fn(model, ids)``, default `gradient_norm`).
    """
    sequences = [[int(t) for t in doc.token_ids] for doc in documents]
    target = next_token_stats(model, sequences, pad_token_id=pad_token_id, batch_size=batch_size)
    reference = (
        token_log_probs(reference_model, sequences, pad_token_id=pad_token_id, batch_size=batch_size)
        if reference_model is not None
        else [None] * len(sequences)
    )
    conditional: list[Any] = [None] * len(sequences)
    if recall_prefix_ids is not None:
        context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        prefix = [int(t) for t in recall_prefix_ids]
        joined, windows = [], []
        for seq in sequences:
            kept, n_doc = recall_window(len(seq), len(prefix), context)
            joined.append(prefix[len(prefix) - kept :] + seq[:n_doc])
            windows.append((kept, n_doc))
        with_prefix = token_log_probs(model, joined, pad_token_id=pad_token_id, batch_size=batch_size)
        # entry j scores token j + 1 of the joined ids: the document's tokens 1..n_doc-1 start at entry kept
        conditional = [lp[kept : kept + n_doc - 1] for lp, (kept, n_doc) in zip(with_prefix, windows)]
    norm_of = grad_norm_fn or gradient_norm
    rows = []
    for doc, seq, (lp, mu, sigma), ref, cond in zip(documents, sequences, target, reference, conditional):
        row: dict[str, Any] = {"id": str(doc.id)}
        if member is not None:
            row["member"] = bool(member)
        scored = seq[1:]
        region = scored_region(doc, len(seq))
        if region is not None:  # a conversation: its replies' tokens only (every per-token quantity alike)
            lp, mu, sigma = (None if x is None else np.asarray(x)[region] for x in (lp, mu, sigma))
            ref = None if ref is None else np.asarray(ref)[region]
            cond = None if cond is None else np.asarray(cond)[region[: len(cond)]]
            cond = cond if cond is not None and cond.size else None
            scored = [t for t, keep in zip(scored, region) if keep]
        row.update(
            membership_scores(
                lp,
                decode(scored),
                min_k=min_k,
                reference_log_probs=ref,
                mean_log_probs=mu,
                std_log_probs=sigma,
                conditional_log_probs=cond,
                token_ids=scored if frequencies is not None else None,
                frequencies=frequencies,
                grad_norm=norm_of(model, seq) if grad_norm else None,
            )
        )
        rows.append(row)
    return rows


def scored_region(doc: Any, n_tokens: int) -> np.ndarray | None:
    """(n_tokens - 1,) bool: which of a document's scored tokens (1..n-1) the attacks read, or None for all of them.
    A conversation (``doc.replies``: [start, end) token spans, data.chat) is scored on its replies only: the loss
    was on them, its prompts were never trained on."""
    replies = getattr(doc, "replies", None)
    if replies is None:
        return None
    region = np.zeros(n_tokens - 1, dtype=bool)
    for start, end in replies:
        region[max(start - 1, 0) : end - 1] = True  # entry j scores token j + 1
    if not region.any():
        raise ValueError(f"document {doc.id!r} has no reply token to score")
    return region


def attack_metrics(
    member_scores: Sequence[float],
    nonmember_scores: Sequence[float],
    target_fprs: Sequence[float] = DEFAULT_TARGET_FPRS,
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
) -> dict[str, Any]:
    """ROC of one attack: AUC (sklearn ``roc_auc_score``), TPR at each target FPR (see ``tpr_at_fpr``), the curve.

    Scores must be oriented higher = member. Ties between a member and a non-member count half (AUC) and make a
    diagonal ROC segment. Returns {"auc", "auc_ci" ([low, high], the 95% percentile bootstrap interval over
    documents of eval.intervals.auc_interval with ``n_resamples`` resamples; None for n_resamples 0),
    "tpr_at_fpr": {"0.01": ..., ...}, "roc": {"fpr": [...], "tpr": [...]}, "n_members", "n_nonmembers",
    "fpr_resolution" (= 1 / n_nonmembers)}.
    """
    if len(member_scores) == 0 or len(nonmember_scores) == 0:
        raise ValueError(
            f"an ROC needs members and non-members, got {len(member_scores)} and "
            f"{len(nonmember_scores)}: evaluate both training and held-out documents"
        )
    scores = np.concatenate([np.asarray(member_scores, float), np.asarray(nonmember_scores, float)])
    if not np.all(np.isfinite(scores)):
        raise ValueError("attack scores must be finite numbers")
    labels = np.concatenate([np.ones(len(member_scores)), np.zeros(len(nonmember_scores))])
    # drop_intermediate=False keeps every threshold, so the interpolation sees the exact curve.
    fpr, tpr, _ = roc_curve(labels, scores, drop_intermediate=False)
    return {
        AUC: float(roc_auc_score(labels, scores)),
        AUC_CI: (auc_interval(member_scores, nonmember_scores, n_resamples=n_resamples) if n_resamples else None),
        TPR_AT_FPR: {f"{t:g}": tpr_at_fpr(fpr, tpr, t) for t in target_fprs},
        "roc": {"fpr": fpr.tolist(), "tpr": tpr.tolist()},
        "n_members": len(member_scores),
        "n_nonmembers": len(nonmember_scores),
        "fpr_resolution": 1.0 / len(nonmember_scores),
    }


def membership_summary(
    member_rows: Sequence[Mapping[str, Any]],
    nonmember_rows: Sequence[Mapping[str, Any]],
    target_fprs: Sequence[float] = DEFAULT_TARGET_FPRS,
    *,
    min_k: float | None = None,
    n_resamples: int = DEFAULT_RESAMPLES,
    notes: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Attack metrics for every attack whose ``score_<attack>`` is present in some member and some non-member row,
    over the rows that have it (ReCaLL's rows leave out the held-out documents of its prefix).

    Returns {"attacks": {attack: attack_metrics(...)}, "orientation": ..., "min_k": min_k, "bootstrap": {...}},
    plus ``notes`` (e.g. where ReCaLL's prefix and DC-PDD's frequencies came from).
    """
    attacks = {}
    for attack in ATTACKS:
        key = f"score_{attack}"
        members = [r[key] for r in member_rows if key in r]
        nonmembers = [r[key] for r in nonmember_rows if key in r]
        if members and nonmembers:
            attacks[attack] = attack_metrics(members, nonmembers, target_fprs, n_resamples=n_resamples)
    return {
        "attacks": attacks,
        "orientation": "higher score = member; members are training documents, non-members held-out documents",
        "min_k": min_k,
        "bootstrap": {
            "n_resamples": n_resamples,
            "confidence": DEFAULT_CONFIDENCE,
            "method": "percentile",
            "seed": BOOTSTRAP_SEED,
            "resampled": "members and non-members separately (scipy.stats.bootstrap, paired=False)",
        },
        **dict(notes or {}),
    }
