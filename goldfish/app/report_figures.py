"""The plots of the compare and eval reports: each built in two steps, ``series = *_series(...)`` (plain lists,
tested) then ``draw_*(series, path)``; every PNG is written to a temporary name and moved into place (atomic)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from matplotlib.ticker import MaxNLocator

from eval.intervals import binomial_interval
from eval.membership import ATTACKS
from eval.metrics import (
    AUC,
    AUC_CI,
    EXACT_MATCH,
    INTERVAL_METRICS,
    ROUGE_L,
    interval_key,
)
from goldfish.app.report_format import fmt as _fmt
from goldfish.app.report_format import new_figure
from goldfish.app.report_format import save_figure as _save_figure

ROC_COLUMNS = 4  # roc.png: panels per row (8 attacks in 2 rows of about 1,600 px instead of one row of 3,700)


# Breakdown kind -> (row key written by eval.breakdown.group_means, column header format, axis label, plot file).
BREAKDOWNS: dict[str, tuple[str, str, str, str]] = {
    "prefix_length": ("prefix_len", "P={}", "prefix length (tokens)", "breakdown_prefix.png"),
    "repeats": ("repeats", "{}x", "times repeated in training", "breakdown_repeats.png"),
}


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


def attack_order(attacks: set[str]) -> list[str]:
    """Attacks in eval.membership's order; unknown ones follow, sorted."""
    return [a for a in ATTACKS if a in attacks] + sorted(attacks - set(ATTACKS))


def roc_series(membership: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """{attack: {label: {"fpr": [...], "tpr": [...], "auc": float}}} for every attack of every label's result."""
    attacks = attack_order({a for result in membership.values() for a in result.get("attacks", {})})
    series: dict[str, dict[str, dict[str, Any]]] = {}
    for attack in attacks:
        series[attack] = {}
        for label, result in membership.items():
            metrics = result.get("attacks", {}).get(attack)
            if metrics is not None and "roc" in metrics:
                series[attack][label] = {
                    "fpr": list(metrics["roc"]["fpr"]),
                    "tpr": list(metrics["roc"]["tpr"]),
                    AUC: metrics.get(AUC),
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
    attacks = attack_order({a for result in membership.values() for a in result.get("attacks", {})})
    return {
        attack: {
            label: {AUC: result["attacks"][attack][AUC], "ci": result["attacks"][attack].get(AUC_CI)}
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


def _colors(labels: Sequence[str], colors: Mapping[str, str] | None) -> dict[str, str]:
    given = dict(colors or {})
    missing = [label for label in labels if label not in given]
    return given | {label: f"C{(len(given) + i) % 10}" for i, label in enumerate(missing)}


def as_float(values: Sequence[Any]) -> list[float]:
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
            axis.plot(s["epoch"], as_float(s[metric]), marker="o", markersize=3, label=label, color=colors[label])
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
                curve["fpr"], curve["tpr"], color=color, linestyle=dash, label=f"{label} (AUC {_fmt(curve[AUC])})"
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
            ci = point.get("ci") or [point[AUC], point[AUC]]
            xs.append(j + offset)
            values.append(point[AUC])
            below.append(max(point[AUC] - ci[0], 0.0))
            above.append(max(ci[1] - point[AUC], 0.0))
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
            ys = as_float(s[metric])
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
