"""Where eval.membership's attacks and mimir's differ, the AUC both ways on one fixture.

mimir (github.com/iamgroot42/mimir) is the implementation users compare membership-inference results with. Three of
our attacks differ from its definitions in a detail (docs/membership.md lists them); this measures what each detail
changes, on a tiny Llama trained on 64 member documents and scored against 63 held-out ones (one more is ReCaLL's
prefix), at three amounts of training. The variants, written from the definitions, not taken from mimir's code:

  * ``grad_norm``: ours -||g||_2 over all weights; mimir's default -mean over parameter tensors of ||g_tensor||_inf.
  * ``zlib``: ours divides by the zlib size of the scored text (the document without its first, unscored token);
    mimir by that of the whole document text.
  * ``recall``: ours compares the same tokens with and without the prefix; mimir's conditional term also scores the
    document's first token (predicted from the prefix).
  * ``dc_pdd``: the published p_t log(1 / f) (ours and mimir's) against p_t log(p_t / f), a KL-divergence term the
    method's name might suggest.

Documents are bytes of Python standard-library source (vocabulary 256, one token per byte), so zlib sizes are those
of real text. Writes a JSON result (``--out``) with every AUC.

    python bench/membership_variants.py --out bench/results/membership_variants.json
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from types import SimpleNamespace

import common
import numpy as np
import torch
from sklearn.metrics import roc_auc_score

from eval.batching import evaluating
from eval.logprobs import token_log_probs
from eval.membership import (
    membership_rows,
    recall_prefix,
    recall_window,
    token_frequencies,
    zlib_bytes,
)

PAD = 0  # byte 0 never occurs in the source text


def stdlib_documents(n: int, length: int) -> list[list[int]]:
    """``n`` documents of ``length`` bytes: consecutive slices of the standard library's modules, in name order."""
    docs: list[list[int]] = []
    for path in sorted(Path(os.__file__).parent.glob("*.py")):
        data = path.read_bytes()
        for start in range(0, len(data) - length, length * 7):  # spread over the file, skip the license headers
            if start > 0 and len(docs) < n:
                docs.append(list(data[start : start + length]))
        if len(docs) >= n:
            return docs
    raise SystemExit(f"the standard library has fewer than {n} documents of {length} bytes")


def mimir_grad_norm(model: torch.nn.Module, ids: list[int]) -> float:
    """mimir's default gradient statistic: the mean over parameter tensors of each tensor's largest |gradient|."""
    params = [p for p in model.parameters() if p.requires_grad]
    with evaluating(model), torch.enable_grad():
        batch = torch.tensor([ids])
        logits = model(input_ids=batch).logits[0, :-1].float()
        loss = torch.nn.functional.cross_entropy(logits, batch[0, 1:])
        grads = torch.autograd.grad(loss, params, allow_unused=True)
    return float(np.mean([float(g.abs().max()) for g in grads if g is not None]))


def train(model: torch.nn.Module, members: list[list[int]], steps: int, lr: float) -> None:
    """Full-batch Adam on the members' next-token loss."""
    batch = torch.tensor(members)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        model(input_ids=batch, labels=batch).loss.backward()
        optimizer.step()
    model.eval()


def auc(members: list[float], nonmembers: list[float]) -> float:
    """AUC with higher score = member."""
    return float(roc_auc_score([1] * len(members) + [0] * len(nonmembers), list(members) + list(nonmembers)))


def variants(model: torch.nn.Module, docs: list[SimpleNamespace], prefix: list[int], freq: np.ndarray) -> dict:
    """Per-document scores of both forms of each differing attack; ``docs`` exclude ReCaLL's prefix document."""
    decode = lambda ids: bytes(ids).decode("utf-8", errors="replace")  # noqa: E731
    rows = membership_rows(model, docs, decode=decode, pad_token_id=PAD, recall_prefix_ids=prefix, frequencies=freq)
    context = model.config.max_position_embeddings
    joined, windows = [], []
    for doc in docs:
        kept, n_doc = recall_window(len(doc.token_ids), len(prefix), context)
        joined.append(prefix[len(prefix) - kept :] + doc.token_ids[:n_doc])
        windows.append((kept, n_doc))
    with_prefix = [np.asarray(lp, np.float64) for lp in token_log_probs(model, joined, pad_token_id=PAD)]
    plain = [np.asarray(lp, np.float64) for lp in token_log_probs(model, [d.token_ids for d in docs], pad_token_id=PAD)]
    out: dict[str, list[float]] = {k: [] for k in ("grad_norm", "zlib", "recall", "dc_pdd")}
    out.update({f"{k}_mimir": [] for k in ("grad_norm", "zlib", "recall")} | {"dc_pdd_p_over_f": []})
    for doc, row, cond, lp, (kept, n_doc) in zip(docs, rows, with_prefix, plain, windows):
        out["grad_norm"].append(row["score_grad_norm"])
        out["grad_norm_mimir"].append(-mimir_grad_norm(model, doc.token_ids))
        out["zlib"].append(row["score_zlib"])
        out["zlib_mimir"].append(-row["loss"] / zlib_bytes(decode(doc.token_ids)))
        out["recall"].append(row["score_recall"])
        # mimir's conditional term: every document token, the first one predicted from the prefix's last token
        out["recall_mimir"].append(float(np.mean(cond[kept - 1 : kept + n_doc - 1]) / np.mean(lp[: n_doc - 1])))
        out["dc_pdd"].append(row["score_dc_pdd"])
        ids = np.asarray(doc.token_ids[1:])
        _, first = np.unique(ids, return_index=True)
        p = np.exp(lp[first])
        out["dc_pdd_p_over_f"].append(float(np.minimum(p * np.log(p / freq[ids[first]]), 0.01).mean()))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=64, help="members, and as many held-out documents (+1 prefix)")
    parser.add_argument("--length", type=int, default=64, help="bytes per document")
    parser.add_argument("--steps", type=int, nargs="+", default=[10, 20, 40], help="training steps of each model")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--out", type=Path, default=None, help="JSON result file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    texts = stdlib_documents(2 * args.docs + 1, args.length)
    members = [SimpleNamespace(id=f"m{i}", token_ids=t) for i, t in enumerate(texts[: args.docs])]
    heldout = [SimpleNamespace(id=f"h{i}", token_ids=t) for i, t in enumerate(texts[args.docs :])]
    prefix, _ = recall_prefix(heldout, 1)
    freq = token_frequencies(texts, 256)
    result: dict = {"docs_per_side": args.docs, "length": args.length, "lr": args.lr, "models": {}}
    for steps in args.steps:
        model = common.build_llama(vocab=256, hidden=64, layers=2, heads=4, intermediate=128, seq=2 * args.length)
        train(model, [m.token_ids for m in members], steps, args.lr)
        scores_in = variants(model, members, prefix, freq)
        scores_out = variants(model, heldout[1:], prefix, freq)
        aucs = {key: round(auc(scores_in[key], scores_out[key]), 4) for key in scores_in}
        member_lps = token_log_probs(model, texts[: args.docs], pad_token_id=PAD)
        mean_loss = -float(np.mean([np.asarray(lp, np.float64).mean() for lp in member_lps]))
        result["models"][f"{steps}_steps"] = {"member_loss": round(mean_loss, 3), "auc": aucs}
        print(f"{steps} steps (member loss {mean_loss:.3f} nats):", aucs)
    if args.out is not None:
        common.write_result(args.out, result)
    assert all(math.isfinite(v) for m in result["models"].values() for v in m["auc"].values())


if __name__ == "__main__":
    main()
