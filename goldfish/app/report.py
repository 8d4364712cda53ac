"""Reports of `goldfish compare` and `goldfish eval`: report.md with one table per instrument, and PNG plots.

Every section is optional: it is rendered only when its data is in the summary, so summaries written before an
instrument existed still render. Each plot is built in two steps, ``series = *_series(...)`` (plain lists, tested)
then ``draw_*(series, path)``; every file is written to a temporary name and moved into place (atomic).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from matplotlib.ticker import MaxNLocator

from data.atomic import json_safe, write_text_atomic
from eval.files import CURVE_FILE, EXTRACTION_FILE, MEMBERSHIP_FILE, ROW_FILES
from eval.intervals import binomial_interval
from eval.membership import ATTACKS
from eval.metrics import (
    EXACT_MATCH,
    INTERVAL_METRICS,
    METRICS,
    ROUGE_L,
    TF_DROPPED_ACCURACY,
    TF_KEPT_ACCURACY,
    interval_key,
)
from goldfish.app.matched import render_matched
from goldfish.app.report_buckets import study_figures, study_section
from goldfish.app.report_format import figure_link as _figure
from goldfish.app.report_format import fmt as _fmt
from goldfish.app.report_format import fmt_ci as _fmt_ci
from goldfish.app.report_format import fmt_interval, new_figure, palette
from goldfish.app.report_format import md_table as _table
from goldfish.app.report_format import save_figure as _save_figure
from goldfish.app.results import HEADLINE_KEYS, PARTS, PartResult

ROC_COLUMNS = 4  # roc.png: panels per row (8 attacks in 2 rows of about 1,600 px instead of one row of 3,700)

# Breakdown kind -> (row key written by eval.breakdown.group_means, column header format, axis label, plot file).
BREAKDOWNS: dict[str, tuple[str, str, str, str]] = {
    "prefix_length": ("prefix_len", "P={}", "prefix length (tokens)", "breakdown_prefix.png"),
    "repeats": ("repeats", "{}x", "times repeated in training", "breakdown_repeats.png"),
}

# Per-document JSON-lines files written beside the summaries (names: eval.files), by the summary key that says they
# exist (None: always written).
PART_FILES: tuple[tuple[str | None, str, str], ...] = (
    (None, ROW_FILES["extraction"], "greedy extraction"),
    ("divergence", ROW_FILES["divergence"], "first divergence from the true suffix"),
    ("probabilistic", ROW_FILES["probabilistic"], "probabilistic extraction"),
    ("beam", ROW_FILES["beam"], "beam-search extraction"),
    ("sampling", ROW_FILES["sampling"], "sampling extraction"),
)
PREFIX_LENGTH_FILE = ("prefix_length", ROW_FILES["prefix_length"], "greedy extraction at each fixed prefix length")

# The headline table: (header, summary key) per column, from the metric registry (eval.metrics.METRICS' headers);
# an interval `<metric>_ci` is shown in its metric's cell.
HEADLINE_COLUMNS = (("docs", "n_docs"),) + tuple((METRICS[key].header, key) for key in HEADLINE_KEYS if key in METRICS)

Entry = tuple[list[str], PartResult]  # (key cells of a table row, e.g. [model, part]; that row's part result)


# ---------------------------------------------------------------------------------------------------------- writing


# ------------------------------------------------------------------------------------------------------- formatting


def _fmt_count(value: Any) -> str:
    """A number of samples: whole below a million, scientific above (they reach 1e48 for unmemorized text)."""
    if value is None:
        return "n/a"
    value = float(value)  # also reads the strings "inf" and "nan" of strict-JSON files
    if math.isnan(value):
        return "n/a"
    if math.isinf(value):
        return "inf"
    return f"{value:,.0f}" if value < 1e6 else f"{value:.2e}"


def _key_order(keys: Sequence[str]) -> list[str]:
    """Keys like "1", "10", "0.5" in numeric order (JSON turns numeric keys into strings)."""
    return sorted(keys, key=float)


# ----------------------------------------------------------------------------------------------------------- series


def curve_series(curves: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, dict[str, list[Any]]]:
    """{label: {"epoch": [...], "step": [...], "exact_match": [...], "rouge_l": [...]}} sorted by epoch."""
    series = {}
    for label, points in curves.items():
        ordered = sorted(points, key=lambda p: (p["epoch"], p.get("step", 0)))
        series[label] = {key: [p.get(key) for p in ordered] for key in ("epoch", "step", *INTERVAL_METRICS)}
    return series


def divergence_series(
    divergences: Mapping[str, Mapping[str, Any]], suffix_len: int | None = None
) -> dict[str, dict[str, Any]]:
    """Per label: "positions" 0..L-1 (suffix token index; L = suffix_len, or past the last divergence), "counts" of
    documents whose greedy continuation first left the true suffix there, "n_docs" and "n_never" (never diverged);
    and, when the summary has the mask's dropped flags, "n_diverged", "n_on_dropped" (first divergences on a
    dropped token), "share_on_dropped", its 95% "share_ci" (Clopper-Pearson unless the summary has one) and
    "share_chance" (the drop rate of the diverged suffixes); None without them."""
    series = {}
    for label, div in divergences.items():
        histogram = {int(k): int(v) for k, v in (div.get("first_divergence_histogram") or {}).items()}
        length = max(suffix_len or 0, max(histogram) + 1 if histogram else 1)
        positions = list(range(length))
        n_diverged, share = int(div["n_diverged"]), div.get("share_on_dropped")
        # summaries before n_on_dropped existed: the count back from the share
        on_dropped = div.get("n_on_dropped", None if share is None else round(float(share) * n_diverged))
        interval = div.get("share_on_dropped_ci")
        if interval is None and on_dropped is not None:
            interval = binomial_interval(int(on_dropped), n_diverged)  # exact: honest at 0 of 5 or 5 of 5
        series[label] = {
            "positions": positions,
            "counts": [histogram.get(i, 0) for i in positions],
            "n_docs": int(div["n_docs"]),
            "n_never": int(div["n_docs"]) - n_diverged,
            "n_diverged": n_diverged,
            "n_on_dropped": on_dropped,
            "share_on_dropped": share,
            "share_ci": None if interval is None else [float(interval[0]), float(interval[1])],
            "share_chance": div.get("share_expected_by_chance"),
        }
    return series


def _attack_order(attacks: set[str]) -> list[str]:
    """Attacks in eval.membership's order; unknown ones follow, sorted."""
    return [a for a in ATTACKS if a in attacks] + sorted(attacks - set(ATTACKS))


def roc_series(membership: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """{attack: {label: {"fpr": [...], "tpr": [...], "auc": float}}} for every attack of every label's result."""
    attacks = _attack_order({a for result in membership.values() for a in result.get("attacks", {})})
    series: dict[str, dict[str, dict[str, Any]]] = {}
    for attack in attacks:
        series[attack] = {}
        for label, result in membership.items():
            metrics = result.get("attacks", {}).get(attack)
            if metrics is not None and "roc" in metrics:
                series[attack][label] = {
                    "fpr": list(metrics["roc"]["fpr"]),
                    "tpr": list(metrics["roc"]["tpr"]),
                    "auc": metrics.get("auc"),
                }
    return series


def breakdown_series(tables: Mapping[str, Sequence[Mapping[str, Any]]], key: str) -> dict[str, dict[str, list[Any]]]:
    """{label: {"x": group values, "exact_match": [...], "rouge_l": [...], "n_docs": [...], "exact_match_ci": [...],
    "rouge_l_ci": [...]}}, sorted by x; a ci entry is the row's [low, high] interval (`<metric>_ci`) or None; groups
    whose value is None (documents without the attribute) are left out of the plot."""
    series = {}
    for label, rows in tables.items():
        kept = sorted((r for r in rows if r.get(key) is not None), key=lambda r: r[key])
        series[label] = {
            "x": [r[key] for r in kept],
            EXACT_MATCH: [r.get(EXACT_MATCH) for r in kept],
            ROUGE_L: [r.get(ROUGE_L) for r in kept],
            "n_docs": [r.get("n_docs") for r in kept],
            interval_key(EXACT_MATCH): [r.get(interval_key(EXACT_MATCH)) for r in kept],
            interval_key(ROUGE_L): [r.get(interval_key(ROUGE_L)) for r in kept],
        }
    return series


def rouge_hist_series(paths: Mapping[str, Path]) -> dict[str, list[float]]:
    """{label: RougeL F of every document in that label's extraction.jsonl}; labels without rows are left out."""
    series = {}
    for label, path in paths.items():
        if path.exists():
            scores = [json.loads(line)[ROUGE_L] for line in path.read_text().splitlines() if line]
            scores = [s for s in scores if s is not None]
            if scores:
                series[label] = scores
    return series


def bar_errors(models: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> dict[str, dict[str, list[list[float]]]]:
    """{metric: {part: [[below per model], [above per model]]}}: matplotlib's yerr from each mean's bootstrap interval
    (`<metric>_ci`; 0 where a model has none), for exact match and RougeL."""
    parts = [p for p in ("train", "heldout") if any(p in m for m in models.values())]
    out: dict[str, dict[str, list[list[float]]]] = {}
    for metric in INTERVAL_METRICS:
        out[metric] = {}
        for part in parts:
            below, above = [], []
            for m in models.values():
                s = m.get(part, {})
                value, ci = float(s.get(metric) or 0.0), s.get(interval_key(metric))
                below.append(max(value - ci[0], 0.0) if ci else 0.0)
                above.append(max(ci[1] - value, 0.0) if ci else 0.0)
            out[metric][part] = [below, above]
    return out


def auc_series(membership: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """{attack: {label: {"auc": float, "ci": [low, high] or None}}} for every attack of every label's result."""
    attacks = _attack_order({a for result in membership.values() for a in result.get("attacks", {})})
    return {
        attack: {
            label: {"auc": result["attacks"][attack]["auc"], "ci": result["attacks"][attack].get("auc_ci")}
            for label, result in membership.items()
            if attack in result.get("attacks", {})
        }
        for attack in attacks
    }


def bar_series(models: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> dict[str, dict[str, list[float]]]:
    """{metric: {part: [value per model, in model order]}} for exact match and RougeL (missing = 0)."""
    parts = [p for p in ("train", "heldout") if any(p in m for m in models.values())]
    return {
        metric: {part: [float(m.get(part, {}).get(metric) or 0.0) for m in models.values()] for part in parts}
        for metric in INTERVAL_METRICS
    }


# ---------------------------------------------------------------------------------------------------------- drawing


def _colors(labels: Sequence[str], colors: Mapping[str, str] | None) -> dict[str, str]:
    given = dict(colors or {})
    missing = [label for label in labels if label not in given]
    return given | {label: f"C{(len(given) + i) % 10}" for i, label in enumerate(missing)}


def _as_float(values: Sequence[Any]) -> list[float]:
    return [math.nan if v is None else float(v) for v in values]  # NaN breaks the line where a value is missing


def draw_bars(
    labels: Sequence[str],
    series: Mapping[str, Mapping[str, list[float]]],
    path: Path,
    errors: Mapping[str, Mapping[str, list[list[float]]]] | None = None,
) -> None:
    """Exact match and RougeL per model, one bar per part, its value printed above it (a 0 stays readable where its
    bar has no height); ``errors`` (see `bar_errors`): the bootstrap intervals as error bars."""
    n_bars = len(labels) * max((len(by_part) for by_part in series.values()), default=1)
    # wider with more bars, capped so the figure stays readable at normal width (about 1,600 px at 110 dpi)
    figure, axes = new_figure(1, 2, figsize=(min(14.5, max(11.0, 0.5 * n_bars + 3)), 4.4))
    titles = {EXACT_MATCH: "Exact match (fraction of documents)", ROUGE_L: "RougeL F-measure (mean)"}
    text_size, rotation = (7, 0) if n_bars <= 10 else (6, 90)
    for axis, (metric, by_part) in zip(axes, series.items()):
        width = 0.8 / max(len(by_part), 1)
        with_errors = False
        for i, (part, values) in enumerate(by_part.items()):
            offset = (i - (len(by_part) - 1) / 2) * width
            xs = [j + offset for j in range(len(labels))]
            yerr = (errors or {}).get(metric, {}).get(part)
            with_errors = with_errors or bool(yerr and any(any(row) for row in yerr))
            color = f"C{i}"
            axis.bar(xs, values, width, label=part, color=color, yerr=yerr, capsize=3, ecolor="black")
            # a zero-height bar draws nothing: a dash at the value marks every bar, 0 included
            axis.hlines(values, [x - width / 2 for x in xs], [x + width / 2 for x in xs], colors=color, linewidth=2.5)
            tops = [v + (yerr[1][j] if yerr else 0.0) for j, v in enumerate(values)]
            for x, value, top in zip(xs, values, tops):
                axis.annotate(
                    f"{value:.2f}",
                    (x, top),
                    xytext=(0, 2),
                    textcoords="offset points",
                    ha="center",
                    va="bottom",
                    fontsize=text_size,
                    rotation=rotation,
                )
        axis.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize=8)
        axis.set_ylim(-0.03, 1.2)  # room below for the dash at 0 and above for the printed values
        axis.set_yticks([0, 0.25, 0.5, 0.75, 1.0])
        axis.set_title(titles[metric] + ("\nbars: 95% bootstrap interval" if with_errors else ""), fontsize=10)
        axis.legend(fontsize=8, loc="upper left")
    _save_figure(figure, path)


def draw_rouge_histograms(
    series: Mapping[str, list[float]], path: Path, title: str, colors: Mapping[str, str] | None = None
) -> None:
    """RougeL histogram per label (the goldfish paper's Fig. 2)."""
    colors = _colors(list(series), colors)
    figure, axis = new_figure(figsize=(7, 4))
    bins = [i / 20 for i in range(21)]
    for label, scores in series.items():
        axis.hist(scores, bins=bins, alpha=0.5, label=label, color=colors[label])
    axis.set_xlabel("RougeL F-measure of the extracted suffix")
    axis.set_ylabel("documents")
    axis.set_title(title)
    axis.legend(fontsize=8)
    _save_figure(figure, path)


def draw_curves(
    series: Mapping[str, Mapping[str, list[Any]]], path: Path, colors: Mapping[str, str] | None = None
) -> None:
    """Exact match (left) and RougeL (right) of greedy extraction of the training documents against epoch."""
    colors = _colors(list(series), colors)
    figure, axes = new_figure(1, 2, figsize=(11, 4))
    for axis, metric, title in (
        (axes[0], EXACT_MATCH, "Exact match (fraction of training documents)"),
        (axes[1], ROUGE_L, "RougeL F-measure (mean)"),
    ):
        for label, s in series.items():
            axis.plot(s["epoch"], _as_float(s[metric]), marker="o", markersize=3, label=label, color=colors[label])
        axis.set_xlabel("epoch (0 = before training)")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.set_ylim(-0.02, 1.05)
        axis.set_title(title)
        axis.legend(fontsize=8)
    _save_figure(figure, path)


def draw_divergence(
    series: Mapping[str, Mapping[str, Any]], path: Path, title: str, colors: Mapping[str, str] | None = None
) -> None:
    """Where greedy decoding first leaves the true suffix, one step histogram per label (the paper's Fig. 4); beside
    it, when the series has the mask's flags, the share of first divergences on a dropped token per label with its
    95% exact interval, against the share expected by chance (the drop rate, about 1/k)."""
    colors = _colors(list(series), colors)
    shares = {label: s for label, s in series.items() if s.get("share_on_dropped") is not None}
    if shares:
        figure, (axis, share_axis) = new_figure(
            1, 2, figsize=(12.5, 4.4), gridspec_kw={"width_ratios": [3, max(2, min(len(shares), 4))]}
        )
    else:
        figure, axis = new_figure(figsize=(8, 4))
    for label, s in series.items():
        axis.step(
            s["positions"],
            s["counts"],
            where="mid",
            color=colors[label],
            label=f"{label} ({s['n_never']}/{s['n_docs']} never diverged)",
        )
    axis.set_xlabel("suffix token index of the first divergence")
    axis.set_ylabel("documents")
    axis.yaxis.set_major_locator(MaxNLocator(integer=True))
    axis.set_title(title, fontsize=10)
    axis.legend(fontsize=7)
    if shares:
        _draw_shares_on_dropped(share_axis, shares, colors)
    _save_figure(figure, path)


def _draw_shares_on_dropped(axis: Any, shares: Mapping[str, Mapping[str, Any]], colors: Mapping[str, str]) -> None:
    """One bar per label: share of first divergences on dropped tokens (k/n above it, the exact interval as an error
    bar), and a dashed black line across the bar at the share expected by chance."""
    for j, (label, s) in enumerate(shares.items()):
        share, interval = float(s["share_on_dropped"]), s.get("share_ci")
        yerr = [[share - interval[0]], [interval[1] - share]] if interval else None
        axis.bar([j], [share], 0.6, color=colors[label], yerr=yerr, capsize=4, ecolor="black")
        axis.hlines([share], [j - 0.3], [j + 0.3], colors=colors[label], linewidth=2.5)  # visible at a share of 0
        top = interval[1] if interval else share
        axis.annotate(
            f"{s['n_on_dropped']}/{s['n_diverged']}",
            (j, top),
            xytext=(0, 2),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=7,
        )
        if s.get("share_chance") is not None:
            axis.hlines(
                float(s["share_chance"]),
                j - 0.4,
                j + 0.4,
                colors="black",
                linestyles="--",
                linewidth=1.5,
                label="expected by chance (drop rate)" if j == 0 else None,
            )
    axis.set_xticks(range(len(shares)), list(shares), rotation=20, ha="right", fontsize=8)
    axis.set_xlim(-0.6, len(shares) - 0.4)
    axis.set_ylim(-0.02, 1.12)
    axis.set_ylabel("share of first divergences")
    axis.set_title("First divergences on a dropped token\n(bars: 95% exact interval)", fontsize=10)
    axis.legend(fontsize=7, loc="upper left")


def draw_roc(
    series: Mapping[str, Mapping[str, Mapping[str, Any]]], path: Path, colors: Mapping[str, str] | None = None
) -> None:
    """One ROC panel per attack, one curve per label; the panels in a grid of at most 4 columns, so 8 attacks fit
    in about 1,600 px."""
    attacks = [a for a, curves in series.items() if curves]
    colors = _colors(list(dict.fromkeys(label for a in attacks for label in series[a])), colors)
    # The same colour and dash for a label in every panel; dashes keep identical curves (AUC 1.0) visible.
    styles = {label: (color, ("-", "--", "-.", ":")[i % 4]) for i, (label, color) in enumerate(colors.items())}
    columns = max(1, min(ROC_COLUMNS, len(attacks)))
    rows = max(1, math.ceil(len(attacks) / columns))
    figure, axes = new_figure(rows, columns, figsize=(3.6 * columns, 3.5 * rows), squeeze=False)
    panels = list(axes.flat)
    for index, (axis, attack) in enumerate(zip(panels, attacks)):
        for label, curve in series[attack].items():
            color, dash = styles[label]
            axis.plot(
                curve["fpr"], curve["tpr"], color=color, linestyle=dash, label=f"{label} (AUC {_fmt(curve['auc'])})"
            )
        axis.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1)
        axis.set_xlim(-0.02, 1.02)
        axis.set_ylim(-0.02, 1.02)
        if index + columns >= len(attacks):  # the lowest panel of its column
            axis.set_xlabel("false positive rate (held-out)", fontsize=8)
        if index % columns == 0:
            axis.set_ylabel("true positive rate (training)", fontsize=8)
        axis.tick_params(labelsize=7)
        axis.set_title(f"{attack} attack", fontsize=9)
        axis.legend(fontsize=6, loc="lower right")
    for axis in panels[len(attacks) :]:
        axis.set_visible(False)
    _save_figure(figure, path)


def draw_auc(
    series: Mapping[str, Mapping[str, Mapping[str, Any]]], path: Path, colors: Mapping[str, str] | None = None
) -> None:
    """AUC of every attack, one bar per label, with its 95% bootstrap interval as an error bar."""
    attacks = [a for a, by_label in series.items() if by_label]
    labels = list(dict.fromkeys(label for a in attacks for label in series[a]))
    colors = _colors(labels, colors)
    # wider with more bars, capped at about 1,600 px (110 dpi) so it stays readable at normal width
    figure, axis = new_figure(figsize=(min(14.5, max(6.0, 1.1 * len(attacks) * max(1, len(labels)) ** 0.5)), 4))
    width = 0.8 / max(len(labels), 1)
    for i, label in enumerate(labels):
        offset = (i - (len(labels) - 1) / 2) * width
        xs, values, below, above = [], [], [], []
        for j, attack in enumerate(attacks):
            point = series[attack].get(label)
            if point is None:
                continue
            ci = point.get("ci") or [point["auc"], point["auc"]]
            xs.append(j + offset)
            values.append(point["auc"])
            below.append(max(point["auc"] - ci[0], 0.0))
            above.append(max(ci[1] - point["auc"], 0.0))
        axis.bar(xs, values, width, yerr=[below, above], capsize=3, label=label, color=colors[label])
    axis.axhline(0.5, color="grey", linestyle=":", linewidth=1)
    axis.set_xticks(range(len(attacks)), attacks, rotation=20, ha="right", fontsize=8)
    axis.set_ylim(0, 1.05)
    axis.set_ylabel("AUC (95% bootstrap interval)")
    axis.set_title("Membership inference AUC per attack")
    axis.legend(fontsize=7)
    _save_figure(figure, path)


def draw_breakdown(
    series: Mapping[str, Mapping[str, list[Any]]],
    path: Path,
    xlabel: str,
    colors: Mapping[str, str] | None = None,
    categorical: bool = False,
) -> None:
    """Exact match (left) and RougeL (right) against a per-document attribute (prefix length, times repeated), one
    line per label, with error bars and a band where the series has intervals (`<metric>_ci`).

    categorical: one evenly spaced tick per group value, each labelled with its n when every label has the same
    (repetition buckets 0, 1, 4, 16, 64: 0 is written "0 (held out)", the targets never inserted); otherwise a
    numeric axis, symmetric-log for geometric values."""
    colors = _colors(list(series), colors)
    values = sorted({float(x) for s in series.values() for x in s["x"] if x is not None})
    figure, axes = new_figure(1, 2, figsize=(12, 4.4))
    for axis, metric, name, title in (
        (axes[0], EXACT_MATCH, "exact match (fraction of documents)", "Exact match"),
        (axes[1], ROUGE_L, "RougeL F-measure (mean)", "RougeL"),
    ):
        with_intervals = False
        for i, (label, s) in enumerate(series.items()):
            if categorical:  # side by side within a bucket, so the error bars of labels do not hide each other
                jitter = 0.06 * (i - (len(series) - 1) / 2)
                xs = [values.index(float(x)) + jitter for x in s["x"]]
            else:
                xs = [float(x) for x in s["x"]]
            ys = _as_float(s[metric])
            intervals = s.get(interval_key(metric)) or [None] * len(ys)
            low = [math.nan if ci is None else float(ci[0]) for ci in intervals]
            high = [math.nan if ci is None else float(ci[1]) for ci in intervals]
            yerr = [[y - lo for y, lo in zip(ys, low)], [hi - y for y, hi in zip(ys, high)]]
            has_ci = any(ci is not None for ci in intervals)
            with_intervals = with_intervals or has_ci
            axis.errorbar(
                xs, ys, yerr=yerr if has_ci else None, marker="o", capsize=3, label=label, color=colors[label]
            )
            if has_ci:
                axis.fill_between(xs, low, high, color=colors[label], alpha=0.12, linewidth=0)
        axis.set_xlabel(xlabel)
        if categorical:
            axis.set_xticks(range(len(values)), _bucket_tick_labels(series, values), fontsize=8)
            axis.set_xlim(-0.5, len(values) - 0.5)
        elif len(values) >= 3 and values[0] >= 0 and values[-1] >= 20 * max(values[1], 1.0):
            # geometric counts (1, 32, 128, 512 repetitions): a symmetric log axis keeps 0 and spreads the small ones
            axis.set_xscale("symlog", linthresh=1.0)
            axis.set_xticks(values)
            axis.set_xticklabels([f"{v:g}" for v in values])
        else:
            axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.set_ylabel(name)
        axis.set_ylim(-0.02, 1.05)
        axis.set_title(f"{title} by {xlabel}" + ("\n(bars and bands: 95% interval)" if with_intervals else ""))
        axis.legend(fontsize=8)
    _save_figure(figure, path)


def _bucket_tick_labels(series: Mapping[str, Mapping[str, list[Any]]], values: Sequence[float]) -> list[str]:
    """Tick labels of a categorical breakdown axis: the value ("0 (held out)" for 0), and "n=N" below it when every
    label has N documents in that group."""
    ticks = []
    for value in values:
        counts = {n for s in series.values() for x, n in zip(s["x"], s["n_docs"]) if float(x) == value}
        tick = "0 (held out)" if value == 0 else f"{value:g}"
        ticks.append(tick + (f"\nn={next(iter(counts))}" if len(counts) == 1 and None not in counts else ""))
    return ticks


# --------------------------------------------------------------------------------------------------------- sections


def _headline_section(key_header: list[str], entries: Sequence[Entry]) -> list[str]:
    rows = [
        keys + [_fmt_ci(s.metric(k), s.metric(interval_key(k))) for _, k in HEADLINE_COLUMNS] for keys, s in entries
    ]
    return _table(key_header + [name for name, _ in HEADLINE_COLUMNS], rows)


def _replies_section(key_header: list[str], entries: Sequence[Entry]) -> list[str]:
    """Conversations (data.chat): per model and part, exact match over replies and kept/dropped accuracy, each with
    an interval that resamples conversations (eval.replies)."""
    rows = []
    for keys, s in entries:
        stats = (s.details.get("replies") or {}).get("statistics")
        if not stats:
            continue
        em = stats[EXACT_MATCH]
        exact = fmt_interval(em["exact_ci"]) + ("" if em["exact_ci_valid"] else " (not independent)")
        rows.append(
            keys
            + [
                f"{stats['n_replies']} / {stats['n_conversations']}",
                f"{em['k']}/{em['n']} {fmt_interval(em['cluster_ci'])}",
                exact,
                *(
                    _fmt_ci(stats[name]["mean"], stats[name]["cluster_ci"])
                    for name in (TF_KEPT_ACCURACY, TF_DROPPED_ACCURACY)
                ),
            ]
        )
    if not rows:
        return []
    header = ["replies / conversations", "replies extracted", "exact 95%", "TF acc kept", "TF acc dropped"]
    return [
        "## Replies",
        "",
        "Each assistant reply is extracted from the conversation before it (prompt: everything up to the reply's "
        "header; suffix: the reply's first tokens). In brackets: 95% bootstrap intervals resampling conversations; "
        "'exact 95%': the Clopper-Pearson interval over replies, valid as stated only with one reply per "
        "conversation.",
        "",
        *_table(key_header + header, rows),
    ]


def _conversations(summary: Mapping[str, Any]) -> bool:
    """Whether a compare summary's documents are conversations (their parts were extracted reply by reply)."""
    return any(
        isinstance(part, Mapping) and "replies" in part
        for parts in (summary.get("details") or {}).values()
        for part in parts.values()
    )


def _curves_section(curves: Mapping[str, Sequence[Mapping[str, Any]]], figures: Sequence[str]) -> list[str]:
    rows = []
    for label, s in curve_series(curves).items():
        if not s["epoch"]:
            continue
        em = _as_float(s[EXACT_MATCH])
        present = [i for i, v in enumerate(em) if not math.isnan(v)]
        peak = max(present, key=lambda i: em[i]) if present else None
        first_hit = next((s["epoch"][i] for i in present if em[i] > 0), None)
        rows.append(
            [
                label,
                f"{s['epoch'][0]}-{s['epoch'][-1]} ({len(s['epoch'])})",
                _fmt(s[EXACT_MATCH][0]),
                _fmt(s[EXACT_MATCH][-1]),
                "n/a" if peak is None else f"{_fmt(em[peak])} (epoch {s['epoch'][peak]})",
                _fmt(s[ROUGE_L][0]),
                _fmt(s[ROUGE_L][-1]),
                _fmt(first_hit),
            ]
        )
    if not rows:
        return []
    return [
        "## Extraction over training",
        "",
        "Greedy extraction of the training documents after each epoch (epoch 0: before training).",
        "",
        *_table(
            [
                "model",
                "epochs (points)",
                "EM first",
                "EM last",
                "EM peak",
                "RougeL first",
                "RougeL last",
                "first epoch with EM > 0",
            ],
            rows,
        ),
        *_figure("em_vs_epochs.png", "exact match and RougeL against epochs", figures),
    ]


def _divergence_section(
    key_header: list[str], entries: Sequence[Entry], figures: Sequence[str], mask_note: str
) -> list[str]:
    rows = []
    for keys, s in entries:
        div = s.instruments.get("divergence")
        if div is None:
            continue
        rows.append(
            keys
            + [
                f"{div['n_diverged']}/{div['n_docs']}",
                str(div["n_docs"] - div["n_diverged"]),
                _fmt(div.get("mean_first_divergence")),
                _fmt(div.get("share_on_dropped")),
                _fmt(div.get("share_expected_by_chance")),
            ]
        )
    if not rows:
        return []
    return [
        "## Divergence",
        "",
        "Where greedy decoding first leaves the true suffix (suffix token index), and the share of those first "
        f"divergences that fall on a position the goldfish mask drops ({mask_note}) against the share expected "
        "by chance (the drop rate of the diverged suffixes).",
        "",
        *_table(
            key_header + ["diverged", "never diverged", "mean first divergence", "share on dropped", "by chance"], rows
        ),
        *_figure("divergence.png", "first divergence positions", figures),
    ]


def _adaptive_section(key_header: list[str], entries: Sequence[Entry]) -> list[str]:
    rows = []
    for keys, s in entries:
        beam, sampling = s.instruments.get("beam"), s.instruments.get("sampling")
        if beam is None and sampling is None:
            continue
        beam_em = beam_rouge = any_exact = rate = best = "n/a"
        if beam is not None:
            beam_em = f"{_fmt(beam.get(EXACT_MATCH))} (width {beam.get('num_beams', 'n/a')})"
            beam_rouge = _fmt(beam.get(ROUGE_L))
        if sampling is not None:
            settings = sampling.get("sampling", {})
            any_exact = (
                f"{_fmt(sampling.get('any_exact'))} ({settings.get('n_samples', 'n/a')} samples, "
                f"T={settings.get('temperature', 'n/a')}, top-p={settings.get('top_p', 'n/a')})"
            )
            rate, best = _fmt(sampling.get("sample_exact_rate")), _fmt(sampling.get("best_match_fraction"))
        rows.append(keys + [_fmt(s.metrics.get(EXACT_MATCH)), beam_em, beam_rouge, any_exact, rate, best])
    if not rows:
        return []
    return [
        "## Adaptive extraction",
        "",
        "Exact match (fraction of documents) by greedy decoding and by the best beam of a beam search; by "
        "sampling: any exact = documents with at least one exact sample, sample exact rate = exact samples / "
        "all samples, best match fraction = mean over documents of the best sample's match fraction.",
        "",
        *_table(
            key_header
            + ["greedy EM", "beam EM", "beam RougeL", "sampling any exact", "sample exact rate", "best match fraction"],
            rows,
        ),
    ]


def _probabilistic_section(key_header: list[str], entries: Sequence[Entry]) -> list[str]:
    present = [(keys, s.instruments["probabilistic"]) for keys, s in entries if "probabilistic" in s.instruments]
    if not present:
        return []
    budgets = _key_order(list({k for _, p in present for k in p.get("expected_fraction_extracted", {})}))
    confidences = _key_order(list({k for _, p in present for k in p.get("median_samples_needed", {})}))
    rows = []
    for keys, p in present:
        rows.append(
            keys
            + [f"T={p.get('temperature', 'n/a')}, top-p={p.get('top_p', 'n/a')}"]
            + [_fmt(p.get("expected_fraction_extracted", {}).get(n)) for n in budgets]
            + [_fmt_count(p.get("median_samples_needed", {}).get(c)) for c in confidences]
            + [_fmt(p.get("fraction_q_at_least_half")), _fmt(p.get("mean_log10_q"))]
        )
    return [
        "## Probabilistic extraction",
        "",
        "q: the exact probability that sampling emits a document's true suffix (product of its token "
        "probabilities). Expected fraction of documents extracted with n samples (mean of 1 - (1 - q)^n), "
        "median number of samples needed to extract a document with probability p, fraction of documents with "
        "q >= 0.5, and mean log10 q over documents with q > 0.",
        "",
        *_table(
            key_header
            + ["sampling"]
            + [f"extracted, n={n}" for n in budgets]
            + [f"samples for p={c}" for c in confidences]
            + ["q >= 0.5", "mean log10 q"],
            rows,
        ),
    ]


def _membership_section(key_header: list[str], entries: Sequence[Entry], figures: Sequence[str]) -> list[str]:
    present = [(keys, result) for keys, result in entries if result.get("attacks")]
    if not present:
        return []
    attacks = _attack_order({a for _, result in present for a in result["attacks"]})
    fprs = sorted(
        {k for _, r in present for m in r["attacks"].values() for k in m.get("tpr_at_fpr", {})}, key=float, reverse=True
    )
    rows, resolutions = [], set()
    for keys, result in present:
        for attack in attacks:
            metrics = result["attacks"].get(attack)
            if metrics is None:
                continue
            resolutions.add(metrics.get("fpr_resolution"))
            rows.append(
                keys
                + [attack, _fmt_ci(metrics.get("auc"), metrics.get("auc_ci"))]
                + [_fmt(metrics.get("tpr_at_fpr", {}).get(f)) for f in fprs]
                + [f"{metrics.get('n_members', 'n/a')}/{metrics.get('n_nonmembers', 'n/a')}"]
            )
    resolution = ", ".join(_fmt(r) for r in sorted(r for r in resolutions if r is not None)) or "n/a"
    return [
        "## Membership inference",
        "",
        "Members: training documents; non-members: held-out documents; scores oriented so higher = member. "
        f"With n held-out documents the FPR moves in steps of 1/n (here {resolution}): a TPR at a smaller FPR "
        "is interpolated from the point with no false positive and says little. In brackets: the 95% percentile "
        "bootstrap interval over documents (members and non-members resampled separately"
        + (f", {present[0][1]['bootstrap']['n_resamples']} resamples" if present[0][1].get("bootstrap") else "")
        + "); exact match and RougeL carry theirs likewise.",
        "",
        *_table(
            key_header
            + ["attack", "AUC [95% CI]"]
            + [f"TPR @ {float(f) * 100:g}% FPR" for f in fprs]
            + ["members/non-members"],
            rows,
        ),
        *_figure("roc.png", "membership inference ROC, every attack", figures),
        *_figure("auc.png", "membership inference AUC per attack with 95% bootstrap intervals", figures),
    ]


def _group_key(kind: str, rows: Sequence[Mapping[str, Any]]) -> str:
    if kind in BREAKDOWNS:
        return BREAKDOWNS[kind][0]
    for row in rows:  # an unknown breakdown: its key is the one field that is not a count or a metric
        for key in row:
            if key != "n_docs" and key not in METRICS:
                return key
    raise ValueError(f"breakdown {kind!r} has no group field in its rows")


def _breakdown_sections(
    key_header: list[str], breakdowns: Mapping[str, Mapping[str, Sequence[Mapping[str, Any]]]], figures: Sequence[str]
) -> list[str]:
    lines: list[str] = []
    for kind, tables in breakdowns.items():
        all_rows = [r for rows in tables.values() for r in rows]
        if not all_rows:
            continue
        key = _group_key(kind, all_rows)
        header_format = BREAKDOWNS[kind][1] if kind in BREAKDOWNS else f"{key}={{}}"
        values = sorted({r[key] for r in all_rows}, key=lambda v: (v is None, v))
        counts = {v: {r.get("n_docs") for r in all_rows if r[key] == v} for v in values}
        header = [
            ("n/a" if v is None else header_format.format(v))
            + (f" (n={next(iter(counts[v]))})" if len(counts[v]) == 1 else "")
            for v in values
        ]
        rows = []
        for label, table in tables.items():
            by_value = {r[key]: r for r in table}
            cells = []
            for v in values:
                r = by_value.get(v)
                cell = "n/a" if r is None else f"{_fmt(r.get(EXACT_MATCH))} / {_fmt(r.get(ROUGE_L))}"
                if r is not None and len(counts[v]) > 1:
                    cell += f" (n={r.get('n_docs')})"
                cells.append(cell)
            rows.append([label] + cells)
        title = BREAKDOWNS[kind][2] if kind in BREAKDOWNS else key
        plot = BREAKDOWNS[kind][3] if kind in BREAKDOWNS else ""
        lines += [
            f"## Breakdown by {title}",
            "",
            "Cells: exact match / RougeL F, means over the documents of each group (n documents; n/a: "
            "documents without the attribute).",
            "",
            *_table(key_header + header, rows),
            *_figure(plot, f"exact match by {title}", figures),
        ]
    return lines


def _files_section(files: Sequence[str]) -> list[str]:
    """Folders with the same set of files share one line: "- `a/`, `b/`: `x.jsonl` (what it holds), ..."."""
    if not files:
        return []
    names_by_folder: dict[str, list[str]] = {}
    for path in files:
        folder, _, name = path.rpartition("/")
        names_by_folder.setdefault(f"{folder}/" if folder else "./", []).append(name)
    folders_by_names: dict[tuple[str, ...], list[str]] = {}
    for folder, names in names_by_folder.items():
        folders_by_names.setdefault(tuple(names), []).append(folder)
    descriptions = {name: text for _, name, text in (*PART_FILES, PREFIX_LENGTH_FILE)} | {
        MEMBERSHIP_FILE: "membership-inference scores",
        CURVE_FILE: "greedy extraction of each training document at each measured epoch",
    }
    return [
        "## Per-document rows",
        "",
        "One JSON object per document per line, behind the tables and plots above (paths relative to this folder):",
        "",
        *(
            "- "
            + ", ".join(f"`{f}`" for f in folders)
            + ": "
            + ", ".join(f"`{n}` ({descriptions.get(n, 'per-document rows')})" for n in names)
            for names, folders in folders_by_names.items()
        ),
        "",
    ]


# ----------------------------------------------------------------------------------------------------- compare view


def _details(summary: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Per model and part the full summary: details when present, else the headline numbers."""
    details = summary.get("details") or {}
    return {label: details.get(label) or parts for label, parts in summary["models"].items()}


def _part_files(s: PartResult) -> list[str]:
    """Names of the per-document files behind one part (extraction.jsonl always, the rest when they ran)."""
    names = [name for key, name, _ in PART_FILES if key is None or key in s.instruments]
    if PREFIX_LENGTH_FILE[0] in s.breakdowns:
        names.append(PREFIX_LENGTH_FILE[1])
    return names


def _compare_entries(summary: Mapping[str, Any]) -> list[Entry]:
    return [
        ([label, part], PartResult.from_summary(s))
        for label, parts in _details(summary).items()
        for part, s in parts.items()
        if part in PARTS
    ]


def compare_per_document_files(summary: Mapping[str, Any]) -> list[str]:
    """Paths (relative to OUT) of the per-document JSON-lines files a compare summary says were written."""
    files = []
    for label, parts in _details(summary).items():
        for part, s in parts.items():
            if part in PARTS:
                files += [f"{label}/eval/{part}/{name}" for name in _part_files(PartResult.from_summary(s))]
        if label in (summary.get("membership") or {}):
            files.append(f"{label}/eval/{MEMBERSHIP_FILE}")
        if label in (summary.get("curves") or {}):
            files.append(f"{label}/{CURVE_FILE}")
    return files


def compare_figures(summary: Mapping[str, Any], out_dir: Path) -> list[str]:
    """Draw every plot the compare summary has data for into out_dir; returns the names of the PNGs written."""
    written = []
    labels = list(summary["models"])
    colors = palette(labels)
    draw_bars(labels, bar_series(summary["models"]), out_dir / "compare.png", bar_errors(summary["models"]))
    written.append("compare.png")
    hist = rouge_hist_series({label: out_dir / label / "eval" / "train" / EXTRACTION_FILE for label in labels})
    if hist:
        draw_rouge_histograms(hist, out_dir / "rouge_hist.png", "Memorization of training documents", colors)
        written.append("rouge_hist.png")
    if summary.get("curves"):
        draw_curves(curve_series(summary["curves"]), out_dir / "em_vs_epochs.png", colors)
        written.append("em_vs_epochs.png")
    trained = {
        label: PartResult.from_summary(parts["train"])
        for label, parts in _details(summary).items()
        if parts.get("train")
    }
    divergences = {
        label: part.instruments["divergence"] for label, part in trained.items() if part.instruments.get("divergence")
    }
    if divergences:
        suffix_len = ((summary.get("config") or {}).get("extraction") or {}).get("suffix_len")
        draw_divergence(
            divergence_series(divergences, suffix_len),
            out_dir / "divergence.png",
            "First divergence from the true suffix (training documents)",
            colors,
        )
        written.append("divergence.png")
    if summary.get("validation_curves"):
        control = ((summary["models"].get("control") or {}).get("validation") or {}).get("loss")
        draw_validation(summary["validation_curves"], out_dir / "val_loss.png", colors, control)
        written.append("val_loss.png")
    written += _membership_figures(summary.get("membership") or {}, out_dir, True, colors)
    written += _breakdown_figures(summary.get("breakdowns") or {}, out_dir, colors)
    written += study_figures(summary, out_dir)
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


def _documents_section(docs: Mapping[str, Any]) -> list[str]:
    """What deduplication did to the selection: settings, every removed duplicate and its twin, kept repeats, and
    the held-out/training 8-gram overlap audit (absent for records written before deduplication existed)."""
    dedup = docs.get("dedup")
    if not dedup:
        return []
    lines = ["## Duplicates", ""]
    if dedup.get("mode") == "off":
        lines += ["Deduplication off (`--dedup off`): copies of a document may sit on both sides of the split.", ""]
    else:
        near = (
            f", near-duplicates at threshold {dedup['threshold']} ({dedup['similarity']})"
            if dedup.get("mode") == "near"
            else ""
        )
        normalized = dedup.get("normalization", "whitespace-normalized")  # records before it say nothing
        lines += [
            f"Deduplication `{dedup['mode']}`: exact text ({normalized}), same selected token "
            f"window{near}; copies are clustered and every cluster is placed on one side of the split; extra "
            f"copies of a training document: `{dedup['duplicates']}`. Every document was examined.",
            "",
        ]
        removed = docs.get("removed") or []
        if removed:
            lines += [
                f"{docs.get('n_removed', 0)} dropped, {docs.get('n_repeats', 0)} kept in training as counted repeats:",
                "",
                "| document | twin (selected) | kind | similarity | side | action |",
                "|---|---|---|---|---|---|",
            ]
            lines += [
                f"| {r['id']} | {r['twin']} | {r['kind']}"
                f"{'' if r.get('matched') in (None, r['twin']) else ' (via ' + str(r['matched']) + ')'} | "
                f"{r['similarity']:.3f} | {r['side']} | {r['action']} |"
                for r in removed
            ]
            lines.append("")
        else:
            lines += ["No duplicates among the documents.", ""]
    audit = docs.get("heldout_train_overlap")
    if audit:
        lines += [
            f"Overlap audit: at most {audit['max_fraction']:.3f} (mean {audit['mean_fraction']:.3f}) of a "
            f"held-out window's word {audit['ngram_words']}-grams occur in training windows (largest: "
            f"`{audit['heldout_id']}`).",
            "",
        ]
    return lines


def _rouge_notes(parts: Iterable[PartResult]) -> list[str]:
    """A warning when rouge-score's default tokenizer (the paper's setting) discards most of some references."""
    flagged = sorted(
        {
            i
            for s in parts
            for i in ((s.details.get("rouge") or {}).get("default_tokenizer_discards_most") or {}).get("ids", [])
        }
    )
    if not flagged:
        return []
    return [
        f"**Warning:** rouge-score's default tokenizer keeps only [a-z0-9]: it discards most characters of "
        f"{len(flagged)} reference text(s) (first: `{flagged[0]}`), whose RougeL is then meaningless; read "
        "`rouge_l_unicode` (Unicode word tokenizer) in the rows and summaries.",
        "",
    ]


def render_markdown(
    summary: Mapping[str, Any], figures: Sequence[str] | None = None, files: Sequence[str] | None = None
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
        files = compare_per_document_files(summary)
    config = summary["config"]
    data = config["data"]
    train = config["train"]
    extraction = config["extraction"]
    docs = summary.get("documents") or {}
    entries = _compare_entries(summary)
    key_header = ["model", "part"]
    membership_entries = [([label], result) for label, result in (summary.get("membership") or {}).items()]
    breakdowns = summary.get("breakdowns") or {}
    timings = summary.get("timings_s") or {}
    lines = [
        "# goldfish compare",
        "",
        f"Model `{config['model']}` (init seed {config['init_seed']}), data `{data['source']}`: {data['n_train']} "
        f"training and {data['n_heldout']} held-out "
        + (
            f"conversations of at most {data['seq_len']} tokens, loss on the assistant's replies only"
            if _conversations(summary)
            else f"documents of {data['seq_len']} tokens"
        )
        + f" (selection seed {data['seed']}).",
        f"Training: {train['epochs']} epochs, batch {train['batch_size']}, lr {train['lr']}, {train['schedule']} "
        f"schedule, {train['precision']}.",
        f"Extraction: greedy, suffix {extraction['suffix_len']} tokens, prefix "
        f"{extraction['prefix_len'] or 'all tokens before the suffix'}.",
        f"Control: {summary.get('control', 'n/a')}.",
        "",
        *(f"**Warning:** {warning}." for warning in summary.get("warnings") or []),
        *([""] if summary.get("warnings") else []),
        *_headline_section(
            key_header,
            [
                ([label, part], PartResult.from_summary(s))
                for label, parts in summary["models"].items()
                for part, s in parts.items()
                if part in PARTS
            ],
        ),
        *_replies_section(key_header, entries),
        *_heldout_loss_section(summary),
        *_validation_section(summary, figures),
        *study_section(summary, figures),
        *(render_matched(summary["matched_controls"]) if summary.get("matched_controls") else []),
        "TF acc: teacher-forced next-token accuracy; kept/dropped split by the model's own goldfish mask (standard "
        "and control models: by the first goldfish mask); suffix TF acc: the share of the true suffix's tokens the "
        "model ranks first.",
        "",
        f"Documents: {len(docs.get('train', []))} train, {len(docs.get('heldout', []))} held-out; ids and SHA-256 of "
        "each are in summary.json under `documents`.",
        "",
        *_documents_section(docs),
        *_rouge_notes(
            PartResult.from_summary(s)
            for parts in (summary.get("details") or {}).values()
            for s in parts.values()
            if isinstance(s, Mapping)
        ),
        *_figure("compare.png", "exact match and RougeL", figures),
        *_figure("rouge_hist.png", "RougeL histograms", figures),
        *_curves_section(summary.get("curves") or {}, figures),
        *_divergence_section(key_header, entries, figures, "standard/control: the first goldfish mask"),
        *_adaptive_section(key_header, entries),
        *_probabilistic_section(key_header, entries),
        *_breakdown_sections(["model"], breakdowns, figures),
        *_membership_section(["model"], membership_entries, figures),
        *_files_section(files),
    ]
    if timings:
        lines += ["Timings (s): " + ", ".join(f"{k} {_fmt_seconds(v)}" for k, v in timings.items()), ""]
    return "\n".join(lines)


def _difference_cell(entry: Mapping[str, Any]) -> str:
    """A loss entry's paired difference to the standard model with its interval and relative size ("" for the
    standard model itself)."""
    if entry.get("difference_to_standard") is None:
        return ""
    return (
        f"{_fmt_ci(entry['difference_to_standard'], entry.get('difference_ci'))} "
        f"({100 * entry['relative_difference']:+.2f}%)"
    )


def _heldout_loss_section(summary: Mapping[str, Any]) -> list[str]:
    """The cost side of every comparison: each model's loss on the held-out documents, never trained on."""
    rows = []
    for label, parts in summary["models"].items():
        v = parts.get("heldout_loss")
        if not v:
            continue
        rows.append([label, _fmt_ci(v["loss"], v.get("loss_ci")), str(v["n_docs"]), _difference_cell(v)])
    if not rows:
        return []
    return [
        "## Utility: loss on the held-out documents",
        "",
        "Mean next-token loss (nats per token, every token, no mask; of a conversation, every token of its "
        "replies) of the held-out documents, which no model "
        "trained on: what memorizing cost on unseen text of the same kind. Intervals: 95% percentile bootstrap "
        "over documents; the difference to the standard model is paired over the same documents.",
        "",
        *_table(["model", "held-out loss", "documents", "difference to standard"], rows),
    ]


def _validation_section(summary: Mapping[str, Any], figures: Sequence[str]) -> list[str]:
    """Validation loss on the held-out background (--background runs): utility beside memorization."""
    rows = []
    for label, parts in summary["models"].items():
        if "validation" not in parts:
            continue
        v = parts["validation"]
        rows.append([label, _fmt_ci(v["loss"], v.get("loss_ci")), _fmt(v["perplexity"]), _difference_cell(v)])
    if not rows:
        return []
    corpus = summary.get("corpus") or {}
    validation = corpus.get("validation") or {}
    lines = [
        "## Validation (held-out background)",
        "",
        f"Mean next-token loss on {validation.get('n_rows', '?')} rows ({validation.get('n_tokens', '?')} "
        f"tokens) of background documents never trained on, every model with the standard loss over every "
        "token. Intervals: 95% percentile bootstrap over the validation rows; the difference to the standard "
        "model is paired (the mean of the per-row differences, on the same rows), so it resolves gaps far smaller "
        "than the two losses' own intervals." + _validation_notes(corpus),
        "",
        *_table(["model", "validation loss", "perplexity", "difference to standard"], rows),
        "",
    ]
    return lines + _figure("val_loss.png", "validation loss against steps", figures)


def _validation_notes(corpus: Mapping[str, Any]) -> str:
    """The sentences beside the validation table: the targets' share of the trained tokens, and the validation
    candidates left out as twins of other background documents (data.background.validation_documents)."""
    notes = ""
    if corpus.get("target_share") is not None:
        notes += (
            f" Target copies are {100 * corpus['target_share']:.1f}% of the {corpus.get('tokens_trained', 0):,} "
            "tokens trained, background text the rest."
        )
    removed = (corpus.get("validation") or {}).get("removed_copies")
    if removed is not None:
        n = removed["exact_text"] + removed["near"]
        notes += (
            f" {n} validation candidate{'' if n == 1 else 's'} with a twin elsewhere in the background "
            f"({removed['exact_text']} with the same normalized text, {removed['near']} held at least half by "
            "another document) were left out of validation and of the stream, so no validation row has a trained "
            "copy."
        )
    return notes


def draw_validation(
    curves: Mapping[str, Sequence[Mapping[str, Any]]],
    path: Path,
    colors: Mapping[str, str] | None = None,
    control: float | None = None,
) -> None:
    """Validation loss against optimizer steps, one line per model (the control as a horizontal line)."""
    colors = _colors(list(curves), colors)
    figure, axis = new_figure(figsize=(6, 4))
    for label, points in curves.items():
        axis.plot(
            [p["step"] for p in points],
            [p["loss"] for p in points],
            marker="o",
            markersize=3,
            label=label,
            color=colors[label],
        )
    if control is not None:
        axis.axhline(control, color="grey", linestyle=":", label="control (untrained)")
    axis.set_xlabel("optimizer step")
    axis.set_ylabel("validation loss (nats per token)")
    axis.set_title("Validation loss on the held-out background")
    axis.legend(fontsize=8)
    _save_figure(figure, path)


def _fmt_seconds(value: Any) -> str:
    return f"{value:.1f}" if isinstance(value, (int, float)) else _fmt(value)


def write_compare_report(summary: Mapping[str, Any], out_dir: Path) -> list[str]:
    """Write OUT/summary.json, OUT/report.md and every PNG the summary has data for; returns the PNG names."""
    out_dir = Path(out_dir)
    figures = compare_figures(summary, out_dir)
    files = [f for f in compare_per_document_files(summary) if (out_dir / f).exists()]
    write_text_atomic(out_dir / "report.md", render_markdown(summary, figures, files))
    # Strict JSON: infinities (samples needed for a suffix sampling never emits) become "inf" (data.atomic.json_safe).
    write_text_atomic(out_dir / "summary.json", json.dumps(json_safe(summary), indent=2, default=str, allow_nan=False))
    return figures


# -------------------------------------------------------------------------------------------------------- eval view


def _eval_parts(summary: Mapping[str, Any]) -> dict[str, PartResult]:
    """The parts of an eval summary: every value that is an extraction summary (has n_docs), typed."""
    parts = {
        k: PartResult.from_summary(v)
        for k, v in summary.items()
        if k != "membership" and isinstance(v, Mapping) and "n_docs" in v
    }
    if not parts:
        raise ValueError(
            "the eval summary has no part summary (a dict with n_docs, e.g. under 'train'); pass the "
            "summary that `goldfish eval` builds: {part: extraction summary, 'membership': ...}"
        )
    return parts


def _eval_breakdowns(parts: Mapping[str, PartResult]) -> dict[str, dict[str, Any]]:
    """{kind: {part: rows}} from each part's breakdowns {kind: rows}."""
    breakdowns: dict[str, dict[str, Any]] = {}
    for part, s in parts.items():
        for kind, rows in s.breakdowns.items():
            breakdowns.setdefault(kind, {})[part] = rows
    return breakdowns


def eval_per_document_files(summary: Mapping[str, Any]) -> list[str]:
    """Paths (relative to OUT) of the per-document JSON-lines files an eval summary says were written."""
    files = [f"{part}/{name}" for part, s in _eval_parts(summary).items() for name in _part_files(s)]
    if summary.get("membership"):
        files.append(MEMBERSHIP_FILE)
    return files


def eval_figures(summary: Mapping[str, Any], out_dir: Path) -> list[str]:
    """Draw every plot the eval summary has data for into out_dir; returns the names of the PNGs written."""
    parts = _eval_parts(summary)
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
    if summary.get("membership"):
        written += _membership_figures({"model": summary["membership"]}, out_dir, False)
    written += _breakdown_figures(_eval_breakdowns(parts), out_dir)
    return written


def render_eval_markdown(
    summary: Mapping[str, Any], figures: Sequence[str] | None = None, files: Sequence[str] | None = None
) -> str:
    """report.md of `goldfish eval`: summary = {part: extraction summary (+ optional "divergence", "probabilistic",
    "beam", "sampling", "breakdowns"), "membership": one model's membership result (optional)}."""
    parts = _eval_parts(summary)
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
        files = eval_per_document_files(summary)
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
        *_headline_section(["part"], entries),
        "TF acc: teacher-forced next-token accuracy; kept/dropped split by the goldfish mask the model is "
        "evaluated with (n/a without one); suffix TF acc: the share of the true suffix's tokens the model ranks "
        "first. In brackets: 95% percentile bootstrap intervals over documents.",
        "",
        *_replies_section(["part"], entries),
        *_figure("headline.png", "exact match and RougeL with 95% bootstrap intervals", figures),
        *_figure("rouge_hist.png", "RougeL histograms", figures),
        *_divergence_section(["part"], entries, figures, "the mask the model was evaluated with; n/a without one"),
        *_adaptive_section(["part"], entries),
        *_probabilistic_section(["part"], entries),
        *_breakdown_sections(["part"], _eval_breakdowns(parts), figures),
        *_rouge_notes(parts.values()),
        *_documents_section(summary.get("documents") or {}),
    ]
    if summary.get("membership"):
        lines += _membership_section([], [([], summary["membership"])], figures)
    lines += _files_section(files)
    return "\n".join(lines)


def write_eval_report(summary: Mapping[str, Any], out_dir: Path) -> list[str]:
    """Write OUT/report.md and every PNG the eval summary has data for; returns the PNG names."""
    out_dir = Path(out_dir)
    figures = eval_figures(summary, out_dir)
    files = [f for f in eval_per_document_files(summary) if (out_dir / f).exists()]
    write_text_atomic(out_dir / "report.md", render_eval_markdown(summary, figures, files))
    return figures
