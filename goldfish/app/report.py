"""Reports of `goldfish compare` and `goldfish eval`: report.md with one table per instrument, and PNG plots.

This module puts a report together: which sections (goldfish.app.report_sections) and which plots
(goldfish.app.report_figures) a summary has data for, in which order, and the files it writes. Every section is
optional: it is rendered only when its data is in the summary, so summaries written before an instrument existed still
render; every file is written to a temporary name and moved into place (atomic).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from data.atomic import json_safe, write_text_atomic
from eval.files import CURVE_FILE, EXTRACTION_FILE, MEMBERSHIP_FILE
from goldfish.app.compare_result import CompareResult
from goldfish.app.eval_result import EvalResult
from goldfish.app.matched import render_matched
from goldfish.app.report_buckets import study_figures, study_section
from goldfish.app.report_figures import (
    BREAKDOWNS,
    auc_series,
    bar_errors,
    bar_series,
    breakdown_series,
    curve_series,
    divergence_series,
    draw_auc,
    draw_bars,
    draw_breakdown,
    draw_curves,
    draw_divergence,
    draw_roc,
    draw_rouge_histograms,
    draw_validation,
    roc_series,
    rouge_hist_series,
)
from goldfish.app.report_format import figure_link as _figure
from goldfish.app.report_format import palette
from goldfish.app.report_sections import (
    PART_FILES,
    PREFIX_LENGTH_FILE,
    Entry,
    adaptive_section,
    breakdown_sections,
    conversations,
    curves_section,
    divergence_section,
    documents_section,
    files_section,
    fmt_seconds,
    headline_section,
    heldout_loss_section,
    membership_section,
    probabilistic_section,
    replies_section,
    rouge_notes,
    validation_section,
)
from goldfish.app.results import PARTS, PartResult


def _part_files(s: PartResult) -> list[str]:
    """Names of the per-document files behind one part (extraction.jsonl always, the rest when they ran)."""
    names = [name for key, name, _ in PART_FILES if key is None or key in s.instruments]
    if PREFIX_LENGTH_FILE[0] in s.breakdowns:
        names.append(PREFIX_LENGTH_FILE[1])
    return names


def _compare_entries(result: CompareResult) -> list[Entry]:
    return [
        ([label, part], s) for label, model in result.models.items() for part, s in model.parts.items() if part in PARTS
    ]


def compare_per_document_files(result: CompareResult) -> list[str]:
    """Paths (relative to OUT) of the per-document JSON-lines files a compare result says were written."""
    files = []
    for label, model in result.models.items():
        for part, s in model.parts.items():
            if part in PARTS:
                files += [f"{label}/eval/{part}/{name}" for name in _part_files(s)]
        if model.membership is not None:
            files.append(f"{label}/eval/{MEMBERSHIP_FILE}")
        if label in result.curves:
            files.append(f"{label}/{CURVE_FILE}")
    return files


def compare_figures(result: CompareResult, out_dir: Path) -> list[str]:
    """Draw every plot the compare result has data for into out_dir; returns the names of the PNGs written."""
    written = []
    labels = list(result.headlines)
    colors = palette(labels)
    draw_bars(labels, bar_series(result.headlines), out_dir / "compare.png", bar_errors(result.headlines))
    written.append("compare.png")
    hist = rouge_hist_series({label: out_dir / label / "eval" / "train" / EXTRACTION_FILE for label in labels})
    if hist:
        draw_rouge_histograms(hist, out_dir / "rouge_hist.png", "Memorization of training documents", colors)
        written.append("rouge_hist.png")
    if result.curves:
        draw_curves(curve_series(result.curves), out_dir / "em_vs_epochs.png", colors)
        written.append("em_vs_epochs.png")
    trained = {label: model.parts["train"] for label, model in result.models.items() if "train" in model.parts}
    divergences = {
        label: part.instruments["divergence"] for label, part in trained.items() if part.instruments.get("divergence")
    }
    if divergences:
        suffix_len = (result.config.get("extraction") or {}).get("suffix_len")  # type: ignore[union-attr]
        draw_divergence(
            divergence_series(divergences, suffix_len),
            out_dir / "divergence.png",
            "First divergence from the true suffix (training documents)",
            colors,
        )
        written.append("divergence.png")
    if result.validation_curves:
        control = result.validation("control").get("loss") if "control" in result.headlines else None
        draw_validation(result.validation_curves, out_dir / "val_loss.png", colors, control)
        written.append("val_loss.png")
    written += _membership_figures(result.membership, out_dir, True, colors)
    written += _breakdown_figures(result.breakdowns, out_dir, colors)
    written += study_figures(result, out_dir)
    return written


def _membership_figures(
    membership: Mapping[str, Mapping[str, Any]],
    out_dir: Path,
    keep_loss_figure: bool,
    colors: Mapping[str, str] | None = None,
) -> list[str]:
    series = roc_series(membership)
    if not any(series.values()):
        return []
    draw_roc(series, out_dir / "roc.png", colors)
    draw_auc(auc_series(membership), out_dir / "auc.png", colors)
    written = ["roc.png", "auc.png"]
    if keep_loss_figure and series.get("loss"):
        draw_roc({"loss": series["loss"]}, out_dir / "roc_loss.png", colors)  # the file name older reports linked
        written.append("roc_loss.png")
    return written


def _breakdown_figures(
    breakdowns: Mapping[str, Mapping[str, Any]], out_dir: Path, colors: Mapping[str, str] | None = None
) -> list[str]:
    written = []
    for kind, (key, _, xlabel, name) in BREAKDOWNS.items():
        series = breakdown_series(breakdowns.get(kind) or {}, key)
        if any(s["x"] for s in series.values()):
            draw_breakdown(series, out_dir / name, xlabel, colors, categorical=kind == "repeats")
            written.append(name)
    return written


def render_markdown(
    result: CompareResult, figures: Sequence[str] | None = None, files: Sequence[str] | None = None
) -> str:
    """report.md of `goldfish compare`. figures: names of the PNGs written (None: every plot the summary has data
    for); files: per-document files to list (None: those the summary says were written)."""
    if figures is None:
        figures = [
            "compare.png",
            "rouge_hist.png",
            "em_vs_epochs.png",
            "val_loss.png",
            "divergence.png",
            "roc.png",
            "auc.png",
            *(v[3] for v in BREAKDOWNS.values()),
        ]
    if files is None:
        files = compare_per_document_files(result)
    config: Any = result.config
    data = config["data"]
    train = config["train"]
    extraction = config["extraction"]
    docs: Any = result.documents
    entries = _compare_entries(result)
    key_header = ["model", "part"]
    membership_entries = [([label], m) for label, m in result.membership.items()]
    breakdowns = result.breakdowns
    timings = result.timings_s
    lines = [
        "# goldfish compare",
        "",
        f"Model `{config['model']}` (init seed {config['init_seed']}), data `{data['source']}`: {data['n_train']} "
        f"training and {data['n_heldout']} held-out "
        + (
            f"conversations of at most {data['seq_len']} tokens, loss on the assistant's replies only"
            if conversations(result)
            else f"documents of {data['seq_len']} tokens"
        )
        + f" (selection seed {data['seed']}).",
        f"Training: {train['epochs']} epochs, batch {train['batch_size']}, lr {train['lr']}, {train['schedule']} "
        f"schedule, {train['precision']}.",
        f"Extraction: greedy, suffix {extraction['suffix_len']} tokens, prefix "
        f"{extraction['prefix_len'] or 'all tokens before the suffix'}.",
        f"Control: {result.control}.",
        "",
        *(f"**Warning:** {warning}." for warning in result.warnings),
        *([""] if result.warnings else []),
        *headline_section(
            key_header,
            [
                ([label, part], PartResult.from_summary(s))  # the headline numbers only, as summary.json's "models"
                for label, parts in result.headlines.items()
                for part, s in parts.items()
                if part in PARTS
            ],
        ),
        *replies_section(key_header, entries),
        *heldout_loss_section(result),
        *validation_section(result, figures),
        *study_section(result, figures),
        *(render_matched(result.matched_controls) if result.matched_controls else []),
        "TF acc: teacher-forced next-token accuracy; kept/dropped split by the model's own goldfish mask (standard "
        "and control models: by the first goldfish mask); suffix TF acc: the share of the true suffix's tokens the "
        "model ranks first.",
        "",
        f"Documents: {len(docs.get('train', []))} train, {len(docs.get('heldout', []))} held-out; ids and SHA-256 of "
        "each are in summary.json under `documents`.",
        "",
        *documents_section(docs),
        *rouge_notes(
            s for model in (result.models.values() if "details" in result.keys else []) for s in model.parts.values()
        ),
        *_figure("compare.png", "exact match and RougeL", figures),
        *_figure("rouge_hist.png", "RougeL histograms", figures),
        *curves_section(result.curves, figures),
        *divergence_section(key_header, entries, figures, "standard/control: the first goldfish mask"),
        *adaptive_section(key_header, entries),
        *probabilistic_section(key_header, entries),
        *breakdown_sections(["model"], breakdowns, figures),
        *membership_section(["model"], membership_entries, figures),
        *files_section(files),
    ]
    if timings:
        lines += ["Timings (s): " + ", ".join(f"{k} {fmt_seconds(v)}" for k, v in timings.items()), ""]
    return "\n".join(lines)


def write_compare_report(result: CompareResult, out_dir: Path) -> list[str]:
    """Write OUT/summary.json, OUT/report.md and every PNG the result has data for; returns the PNG names."""
    out_dir = Path(out_dir)
    figures = compare_figures(result, out_dir)
    files = [f for f in compare_per_document_files(result) if (out_dir / f).exists()]
    write_text_atomic(out_dir / "report.md", render_markdown(result, figures, files))
    summary = result.to_json()
    # Strict JSON: infinities (samples needed for a suffix sampling never emits) become "inf" (data.atomic.json_safe).
    write_text_atomic(out_dir / "summary.json", json.dumps(json_safe(summary), indent=2, default=str, allow_nan=False))
    return figures


def _eval_breakdowns(parts: Mapping[str, PartResult]) -> dict[str, dict[str, Any]]:
    """{kind: {part: rows}} from each part's breakdowns {kind: rows}."""
    breakdowns: dict[str, dict[str, Any]] = {}
    for part, s in parts.items():
        for kind, rows in s.breakdowns.items():
            breakdowns.setdefault(kind, {})[part] = rows
    return breakdowns


def eval_per_document_files(result: EvalResult) -> list[str]:
    """Paths (relative to OUT) of the per-document JSON-lines files an eval result says were written."""
    files = [f"{part}/{name}" for part, s in result.parts.items() for name in _part_files(s)]
    if result.membership:
        files.append(MEMBERSHIP_FILE)
    return files


def eval_figures(result: EvalResult, out_dir: Path) -> list[str]:
    """Draw every plot the eval result has data for into out_dir; returns the names of the PNGs written."""
    parts = result.parts
    written = []
    hist = rouge_hist_series({part: out_dir / part / EXTRACTION_FILE for part in parts})
    if hist:
        draw_rouge_histograms(hist, out_dir / "rouge_hist.png", "RougeL of the extracted suffixes")
        written.append("rouge_hist.png")
    divergences = {part: s.instruments["divergence"] for part, s in parts.items() if s.instruments.get("divergence")}
    if divergences:
        configs = [s.details["config"] for s in parts.values() if s.details.get("config")]
        suffix_len = configs[0].get("suffix_len") if configs else None
        draw_divergence(
            divergence_series(divergences, suffix_len),
            out_dir / "divergence.png",
            "First divergence from the true suffix",
        )
        written.append("divergence.png")
    models = {"model": {part: s.headline() for part, s in parts.items()}}
    draw_bars(["model"], bar_series(models), out_dir / "headline.png", bar_errors(models))
    written.append("headline.png")
    if result.membership:
        written += _membership_figures({"model": result.membership}, out_dir, False)
    written += _breakdown_figures(_eval_breakdowns(parts), out_dir)
    return written


def render_eval_markdown(
    result: EvalResult, figures: Sequence[str] | None = None, files: Sequence[str] | None = None
) -> str:
    """report.md of `goldfish eval`. figures: names of the PNGs written (None: every plot the result has data for);
    files: per-document files to list (None: those the result says were written)."""
    parts = result.parts
    if figures is None:
        figures = [
            "headline.png",
            "rouge_hist.png",
            "divergence.png",
            "roc.png",
            "auc.png",
            *(v[3] for v in BREAKDOWNS.values()),
        ]
    if files is None:
        files = eval_per_document_files(result)
    entries = [([part], s) for part, s in parts.items()]
    config = next((s.details["config"] for s in parts.values() if s.details.get("config")), None)
    lines = [
        "# goldfish eval",
        "",
        "Documents: " + ", ".join(f"{part} {s.n_docs}" for part, s in parts.items()) + ".",
    ]
    if config is not None:
        lines.append(
            f"Extraction: greedy, suffix {config.get('suffix_len')} tokens, prefix "
            f"{config.get('prefix_len') or 'all tokens before the suffix'}."
        )
    lines += [
        "",
        *headline_section(["part"], entries),
        "TF acc: teacher-forced next-token accuracy; kept/dropped split by the goldfish mask the model is "
        "evaluated with (n/a without one); suffix TF acc: the share of the true suffix's tokens the model ranks "
        "first. In brackets: 95% percentile bootstrap intervals over documents.",
        "",
        *replies_section(["part"], entries),
        *_figure("headline.png", "exact match and RougeL with 95% bootstrap intervals", figures),
        *_figure("rouge_hist.png", "RougeL histograms", figures),
        *divergence_section(["part"], entries, figures, "the mask the model was evaluated with; n/a without one"),
        *adaptive_section(["part"], entries),
        *probabilistic_section(["part"], entries),
        *breakdown_sections(["part"], _eval_breakdowns(parts), figures),
        *rouge_notes(parts.values()),
        *documents_section(result.documents or {}),
    ]
    if result.membership:
        lines += membership_section([], [([], result.membership)], figures)
    lines += files_section(files)
    return "\n".join(lines)


def write_eval_report(result: EvalResult, out_dir: Path) -> list[str]:
    """Write OUT/report.md and every PNG the eval result has data for; returns the PNG names."""
    out_dir = Path(out_dir)
    figures = eval_figures(result, out_dir)
    files = [f for f in eval_per_document_files(result) if (out_dir / f).exists()]
    write_text_atomic(out_dir / "report.md", render_eval_markdown(result, figures, files))
    return figures
