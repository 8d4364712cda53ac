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
        "Timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in summary["timings_s"].items()),
        "",
        "![exact match and RougeL](compare.png)",
        "",
        "![RougeL histograms](rouge_hist.png)",
        "",
    ]
    return "\n".join(lines)


def write_compare_report(summary: dict[str, Any], out_dir: Path) -> None:
    """Write OUT/summary.json, OUT/report.md, OUT/compare.png and OUT/rouge_hist.png."""
    plot_bars(summary, out_dir / "compare.png")
    plot_rouge_histograms(out_dir, list(summary["models"]), out_dir / "rouge_hist.png")
    _atomic_write(out_dir / "report.md", render_markdown(summary))
    _atomic_write(out_dir / "summary.json", json.dumps(summary, indent=2, default=str))
