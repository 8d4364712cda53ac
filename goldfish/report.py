"""The report of `goldfish compare`: summary.json, report.md and PNG plots."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt  # noqa: E402


def _atomic_write(path: Path, text: str) -> None:
    staging = path.with_name(f".{path.name}.partial-{os.getpid()}")
    staging.write_text(text)
    os.replace(staging, path)


def _fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def _rows(out_dir: Path, label: str, part: str) -> list[dict[str, Any]]:
    path = out_dir / label / "eval" / part / "extraction.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def plot_bars(summary: dict[str, Any], path: Path) -> None:
    """Exact match and RougeL per model, on training and held-out documents."""
    labels = list(summary["models"])
    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.38
    for axis, metric, title in ((axes[0], "exact_match", "Exact match (fraction of documents)"),
                                (axes[1], "rouge_l", "RougeL F-measure (mean)")):
        for offset, part in ((-width / 2, "train"), (width / 2, "heldout")):
            values = [summary["models"][label][part][metric] or 0.0 for label in labels]
            axis.bar([i + offset for i in range(len(labels))], values, width, label=part)
        axis.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize=8)
        axis.set_ylim(0, 1.05)
        axis.set_title(title)
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_rouge_histograms(out_dir: Path, labels: list[str], path: Path) -> None:
    """RougeL of each training document's extraction, one histogram per model (the goldfish paper's Fig. 2)."""
    figure, axis = plt.subplots(figsize=(7, 4))
    bins = [i / 20 for i in range(21)]
    for label in labels:
        scores = [row["rouge_l"] for row in _rows(out_dir, label, "train")]
        if scores:
            axis.hist(scores, bins=bins, alpha=0.5, label=label)
    axis.set_xlabel("RougeL F-measure of the extracted suffix")
    axis.set_ylabel("training documents")
    axis.set_title("Memorization of training documents")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_roc(summary: dict[str, Any], path: Path, attack: str = "loss") -> bool:
    """ROC curves of one membership-inference attack, one per model. Returns False when there is nothing to plot."""
    curves = {label: result["attacks"][attack]["roc"] for label, result in summary.get("membership", {}).items()
              if attack in result.get("attacks", {})}
    if not curves:
        return False
    figure, axis = plt.subplots(figsize=(5, 5))
    for label, roc in curves.items():
        axis.plot(roc["fpr"], roc["tpr"], label=label)
    axis.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1)
    axis.set_xlabel("false positive rate (held-out documents)")
    axis.set_ylabel("true positive rate (training documents)")
    axis.set_title(f"Membership inference, {attack} attack")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


def _instrument_lines(summary: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    membership = summary.get("membership", {})
    if membership:
        attacks = sorted({a for result in membership.values() for a in result.get("attacks", {})})
        lines += ["## Membership inference", "",
                  "Members: training documents; non-members: held-out documents; higher score = member. "
                  "AUC (TPR at 1% FPR); with n held-out documents the FPR resolution is 1/n.", "",
                  "| model | " + " | ".join(attacks) + " |", "|---|" + "---|" * len(attacks)]
        for label, result in membership.items():
            cells = []
            for attack in attacks:
                metrics = result.get("attacks", {}).get(attack)
                cells.append("n/a" if metrics is None else
                             f"{metrics['auc']:.3f} ({_fmt(metrics['tpr_at_fpr'].get('0.01'))})")
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines += [""]
    rows = []
    for label, parts in summary.get("details", {}).items():
        train = parts.get("train", {})
        div, prob = train.get("divergence"), train.get("probabilistic")
        if div is None:
            continue
        rows.append(f"| {label} | {div['n_diverged']}/{div['n_docs']} | {_fmt(div.get('mean_first_divergence'))} | "
                    f"{_fmt(div.get('share_on_dropped'))} | {_fmt(div.get('share_expected_by_chance'))} | "
                    f"{_fmt((prob or {}).get('fraction_q_at_least_half'))} |")
    if rows:
        lines += ["## Divergence and probabilistic extraction (training documents)", "",
                  "Where greedy decoding first leaves the true suffix, the share of those first divergences that fall "
                  "on a position the goldfish mask drops (standard/control: the first goldfish mask) against the "
                  "share expected by chance, and the fraction of documents whose suffix sampling at temperature 1 "
                  "emits with probability >= 0.5.", "",
                  "| model | diverged | mean first divergence | share on dropped | by chance | q >= 0.5 |",
                  "|---|---|---|---|---|---|", *rows, ""]
    return lines


def render_markdown(summary: dict[str, Any]) -> str:
    config = summary["config"]
    docs = summary["documents"]
    lines = [
        "# goldfish compare",
        "",
        f"Model `{config['model']}` (init seed {config['init_seed']}), data `{config['data']['source']}`: "
        f"{config['data']['n_train']} training and {config['data']['n_heldout']} held-out documents of "
        f"{config['data']['seq_len']} tokens (selection seed {config['data']['seed']}).",
        f"Training: {config['train']['epochs']} epochs, batch {config['train']['batch_size']}, lr {config['train']['lr']}, "
        f"{config['train']['schedule']} schedule, {config['train']['precision']}.",
        f"Extraction: greedy, suffix {config['extraction']['suffix_len']} tokens, prefix "
        f"{config['extraction']['prefix_len'] or 'all tokens before the suffix'}.",
        f"Control: {summary['control']}.",
        "",
        "| model | part | docs | exact match | RougeL F | RougeL recall | Rouge1 | Rouge2 | match fraction | "
        "longest correct prefix | TF acc | TF acc kept | TF acc dropped |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, parts in summary["models"].items():
        for part, s in parts.items():
            lines.append("| " + " | ".join([label, part] + [_fmt(s.get(k)) for k in (
                "n_docs", "exact_match", "rouge_l", "rouge_l_recall", "rouge_1", "rouge_2", "match_fraction",
                "longest_correct_prefix", "tf_accuracy", "tf_kept_accuracy", "tf_dropped_accuracy")]) + " |")
    lines += [
        "",
        "TF acc: teacher-forced next-token accuracy; kept/dropped split by the model's own goldfish mask (standard and "
        "control models: by the first goldfish mask).",
        "",
        f"Documents: {len(docs.get('train', []))} train, {len(docs.get('heldout', []))} held-out; ids and SHA-256 of "
        "each are in summary.json under `documents`.",
        "",
        *_instrument_lines(summary),
        "Timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in summary["timings_s"].items()),
        "",
        "![exact match and RougeL](compare.png)",
        "",
        "![RougeL histograms](rouge_hist.png)",
        "",
        "![membership inference ROC](roc_loss.png)" if summary.get("membership") else "",
        "",
    ]
    return "\n".join(lines)


def write_compare_report(summary: dict[str, Any], out_dir: Path) -> None:
    """Write OUT/summary.json, OUT/report.md, OUT/compare.png and OUT/rouge_hist.png."""
    plot_bars(summary, out_dir / "compare.png")
    plot_rouge_histograms(out_dir, list(summary["models"]), out_dir / "rouge_hist.png")
    plot_roc(summary, out_dir / "roc_loss.png")
    _atomic_write(out_dir / "report.md", render_markdown(summary))
    _atomic_write(out_dir / "summary.json", json.dumps(summary, indent=2, default=str))
