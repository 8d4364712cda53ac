"""report.md sections and plots of a repetition-bucket study: per bucket every measure with its interval, the tests
between models and the k sweep.

Rendered from a CompareResult's `buckets`, `bucket_tests`, `corpus` and validation losses (one seed); the plots and
the paired table are shared with the combination of several seeds (goldfish.app.report_seeds).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eval.metrics import EXACT_MATCH, ROUGE_L, SUFFIX_LOGPROB_MEAN
from goldfish.app.bucket_section import BucketStats, ModelBuckets
from goldfish.app.bucket_tests import BucketTest
from goldfish.app.compare_result import CompareResult
from goldfish.app.report_format import figure_link as _figure
from goldfish.app.report_format import fmt as _fmt
from goldfish.app.report_format import fmt_ci as _fmt_ci
from goldfish.app.report_format import md_table as _table
from goldfish.app.report_format import new_figure, palette
from goldfish.app.report_format import save_figure as _save_figure
from goldfish.app.results import Interval
from goldfish.app.seeds_result import SeedBucket

K_SWEEP_FILE = "k_sweep.png"
BUCKETS_FILE = "buckets.png"


def _pct(value: Any) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _p(value: Any) -> str:
    if value is None:
        return "n/a"
    return f"{value:.2g}" if value >= 0.001 else f"{value:.1e}"


def _exact(entry: BucketStats) -> str:
    """ "3/32 = 0.094 [0.020, 0.250]": the count, the rate and its Clopper-Pearson interval."""
    return f"{entry.k}/{entry.n} = {_fmt_ci(entry.rate, entry.rate_ci)}"


def _mean(entry: BucketStats, metric: str) -> str:
    """A measure's mean over the bucket's targets with its bootstrap interval."""
    return _fmt_ci(entry.means.get(metric), entry.intervals.get(metric))


def study_section(compared: CompareResult, figures: Sequence[str]) -> list[str]:
    """The protocol (targets' share, spread, split) and the per-bucket tables of one comparison."""
    buckets = compared.buckets or {}
    if not buckets:
        return []
    lines = ["## Per repetition bucket", ""]
    corpus: Any = compared.corpus or {}
    split = next(iter(buckets.values())).split
    prefix = split.prefix_len
    lines.append(
        f"Targets are split into a prefix of {prefix if prefix else 'all but the suffix'} tokens and a suffix of "
        f"{split.suffix_len} tokens, the same for every bucket. Bucket 0: held-out targets of the same pool, "
        "never trained on (the non-members of the membership attacks)."
    )
    if corpus:
        assignment = corpus.get("buckets") or {}
        lines.append(
            f"Targets per bucket: {', '.join(f'{b}: {n}' for b, n in (assignment.get('n_per_bucket') or {}).items())}"
            f" ({assignment.get('assignment', '')}). Target copies are {_pct(corpus.get('target_share'))} of the "
            f"{corpus.get('tokens_trained', 0):,} tokens trained; at most {corpus.get('most_copies_in_a_row')} "
            "copies arrive back to back."
        )
    lines += [
        "Exact match: count/targets = rate [95% Clopper-Pearson interval; the targets are independent within one "
        "model]; RougeL, suffix log-likelihood: mean [95% bootstrap interval over targets].",
        "Against the standard model every model is scored on the same targets, so the comparison is paired: "
        "discordant targets (extracted by one model only), the two-sided exact McNemar test on them, and the "
        "differences (this model minus standard) with a 95% percentile bootstrap over targets that draws the same "
        "targets for both models. Fisher's exact p treats the two counts as independent samples, which they are not; "
        "it is shown for reference only.",
        "",
    ]
    tests = compared.bucket_tests.models if compared.bucket_tests is not None else {}
    for label, result in buckets.items():
        membership = {m.repeats: m for m in result.membership}
        rows = []
        for entry in result.extraction:
            bucket = membership.get(entry.repeats)
            attack = bucket.attacks.get("loss") if bucket is not None else None
            rows.append(
                [
                    str(entry.repeats),
                    _exact(entry),
                    _mean(entry, ROUGE_L),
                    _mean(entry, SUFFIX_LOGPROB_MEAN),
                    _fmt_ci(attack.auc, attack.auc_ci) if attack else "",
                    _fmt_ci(attack.tpr_at_fpr, attack.tpr_at_fpr_ci) if attack else "",
                ]
            )
        lines += [f"**{label}**", ""]
        lines += _table(
            [
                "copies",
                "exact match",
                "RougeL",
                "suffix log-likelihood / token",
                "loss-attack AUC vs bucket 0",
                "TPR at 1% FPR",
            ],
            rows,
        )
        lines += paired_table(tests.get(label), paired="exact McNemar p", seeds=False)
        lines += _field_scores(result)
        lines += _prefix_table(result)
    lines += _figure(BUCKETS_FILE, "extraction by repetitions with intervals", figures)
    lines += _figure(K_SWEEP_FILE, "extraction and validation loss against k", figures)
    return lines


def _difference(test: BucketTest, metric: str) -> str:
    value = test.differences.get(metric)
    return "n/a" if value is None else _fmt_ci(value, test.difference_intervals.get(metric))


def paired_table(tests: Sequence[BucketTest] | None, *, paired: str, seeds: bool) -> list[str]:
    """A model against the standard model bucket by bucket (eval.paired.paired_buckets entries, with Fisher's p under
    one seed): the extracted counts, the discordant ones, the paired test and the paired differences. A summary
    written before the paired tests has Fisher's test of the two counts only: that table, and the sentence saying
    so."""
    if not tests:
        return []
    if not all(t.paired for t in tests):
        return _unpaired_table(tests)
    rows = []
    for t in tests:
        n = t.n_targets * t.n_seeds  # type: ignore[operator]
        row = [
            str(t.repeats),
            f"{t.reference_k}/{n} vs {t.model_k}/{n}",
            f"{t.reference_only} / {t.model_only}",
            _p(t.sign_flip_p if seeds else t.mcnemar_p),
            _difference(t, EXACT_MATCH),
            _difference(t, ROUGE_L),
        ]
        rows.append(row if seeds else [*row, _p(t.unpaired.fisher_p if t.unpaired is not None else None)])
    unit = "target-seed pairs" if seeds else "targets"
    interval = "cluster bootstrap over targets" if seeds else "paired bootstrap over targets"
    header = [
        "copies",
        f"extracted: standard vs this ({unit})",
        "discordant: standard only / this only",
        paired,
        f"exact-match difference [{interval}]",
        f"RougeL difference [{interval}]",
    ]
    return ["Against standard, paired over the same targets:", ""] + _table(
        header if seeds else [*header, "Fisher p (unpaired, reference only)"], rows
    )


def _unpaired_table(tests: Sequence[BucketTest]) -> list[str]:
    """The tests of a summary written before the paired ones: each model's extracted counts against the standard
    model's and Fisher's exact p, which treats the two counts as independent samples."""
    rows = [
        [
            str(t.repeats),
            f"{t.unpaired.a_k}/{t.unpaired.a_n} vs {t.unpaired.b_k}/{t.unpaired.b_n}" if t.unpaired else "n/a",
            _p(t.unpaired.fisher_p if t.unpaired else None),
        ]
        for t in tests
    ]
    return [
        "Against standard: this summary was written before the paired tests (McNemar, the paired differences); it "
        "has Fisher's exact test of the two counts only, which treats them as independent samples:",
        "",
    ] + _table(["copies", "extracted: standard vs this (targets)", "Fisher p (unpaired)"], rows)


def _field_scores(result: ModelBuckets) -> list[str]:
    lines = []
    recall = result.recall_at_incorrect
    if recall:
        split = result.split
        lines.append(
            "lm-extraction-benchmark recall of the trained targets (one greedy guess each, ranked by the model's mean "
            f"log-probability of its guess; here at {split.prefix_len}/{split.suffix_len} tokens, the "
            "benchmark's own split is 50/50): "
            + ", ".join(f"at {n} incorrect {_fmt(r.recall)}" for n, r in recall.items())
            + "."
        )
    pythia = result.pythia
    if pythia:
        lines.append(
            "Pythia 32/32 memorization score (mean share of the 32 suffix tokens greedy decoding reproduces; share "
            "of targets with all 32) by copies: "
            + "; ".join(f"{t.repeats}: {_fmt(t.score)} ({_fmt(t.memorized)})" for t in pythia.table)
            + "."
        )
    return lines + [""] if lines else []


def _prefix_table(result: ModelBuckets) -> list[str]:
    by_prefix = result.prefix_length
    if not by_prefix:
        return []
    prefixes = sorted(by_prefix, key=int)
    buckets = sorted({e.repeats for table in by_prefix.values() for e in table})
    rows = []
    for bucket in buckets:
        cells = []
        for prefix in prefixes:
            entry = next((e for e in by_prefix[prefix] if e.repeats == bucket), None)
            cells.append(_exact(entry) if entry else "n/a")
        rows.append([str(bucket), *cells])
    return ["Exact match by prefix length (the suffix right after the first P tokens):", ""] + _table(
        ["copies", *(f"P = {p}" for p in prefixes)], rows
    )


# ---------------------------------------------------------------------------------------------------------- figures


@dataclass(frozen=True)
class BucketPoint:
    """One model at one bucket as the plots draw it: exact match with its inner and outer interval (one seed: the
    Clopper-Pearson interval and no outer one; several seeds: the cluster bootstrap over targets and the
    conservative exact bounds, eval.paired, which are not zero-wide when no target, or every one, was extracted) and
    RougeL with its bootstrap interval over targets."""

    repeats: int
    exact_match: float | None
    inner: Interval
    outer: Interval
    rouge_l: float | None
    rouge_l_ci: Interval

    @classmethod
    def of_bucket(cls, entry: BucketStats) -> BucketPoint:
        """A point of one comparison's bucket entry (an entry of ModelBuckets.extraction)."""
        return cls(
            entry.repeats, entry.rate, entry.rate_ci, None, entry.means.get(ROUGE_L), entry.intervals.get(ROUGE_L)
        )

    @classmethod
    def of_seeds(cls, bucket: SeedBucket) -> BucketPoint:
        """A point of a bucket combined over seeds."""
        pooled = bucket.pooled
        return cls(
            bucket.repeats,
            bucket.means.get(EXACT_MATCH),
            pooled.cluster_ci if pooled is not None else bucket.intervals.get(EXACT_MATCH),
            pooled.exact_bounds if pooled is not None else None,
            bucket.means.get(ROUGE_L),
            bucket.intervals.get(ROUGE_L),
        )


def _error(values: Sequence[float], intervals: Sequence[Sequence[float] | None]) -> list[list[float]]:
    """matplotlib's yerr (distances below and above) of values and their [low, high] intervals (0 where none)."""
    return [
        [v - c[0] if c else 0.0 for v, c in zip(values, intervals)],
        [c[1] - v if c else 0.0 for v, c in zip(values, intervals)],
    ]


MARKERS = "osD^vP*Xh<>"


def draw_buckets(tables: Mapping[str, Sequence[BucketPoint]], path: Path, title: str = "") -> None:
    """Exact match and RougeL against the copies trained on (categorical axis, 0 = held out): one marker per model,
    shifted sideways so that no model hides another, with its interval as an error bar. Exact match: the
    Clopper-Pearson interval (one seed), or the cluster bootstrap over targets (thick) inside the conservative exact
    bounds (thin) with several seeds; RougeL: the bootstrap interval over targets."""
    colors = palette(list(tables))
    figure, axes = new_figure(1, 2, figsize=(12, 4.5))
    width = 0.7  # of the unit between two buckets, shared by the models' markers
    step = width / max(len(tables), 1)
    for axis, metric, name in ((axes[0], EXACT_MATCH, "exact match"), (axes[1], ROUGE_L, "RougeL")):
        for i, (label, table) in enumerate(tables.items()):
            x = [j - width / 2 + step * (i + 0.5) for j in range(len(table))]
            values = [e.exact_match if metric == EXACT_MATCH else e.rouge_l for e in table]
            y = [math.nan if v is None else v for v in values]
            style = dict(color=colors[label], marker=MARKERS[i % len(MARKERS)], markersize=5, linestyle="none")
            if metric == EXACT_MATCH:
                inner, outer = [e.inner for e in table], [e.outer for e in table]
                if any(outer):
                    axis.errorbar(x, y, yerr=_error(y, outer), color=colors[label], linestyle="none", elinewidth=0.8)
                axis.errorbar(x, y, yerr=_error(y, inner), elinewidth=2.2, capsize=2, label=label, **style)
            else:
                ci = [e.rouge_l_ci for e in table]
                axis.errorbar(x, y, yerr=_error(y, ci), elinewidth=1.5, capsize=2, label=label, **style)
            axis.plot(x, y, color=colors[label], alpha=0.35, linewidth=0.8)  # guides the eye along one model
        first = next(iter(tables.values()))
        axis.set_xticks(range(len(first)), [str(e.repeats) for e in first])
        for j in range(len(first) - 1):
            axis.axvline(j + 0.5, color="0.85", linewidth=0.8)
        axis.set_xlabel("copies trained on (0 = held out)")
        axis.set_ylabel(name)
        axis.set_ylim(-0.03, 1.03)
        axis.grid(alpha=0.3, axis="y")
    several = any(e.outer for table in tables.values() for e in table)
    axes[0].set_title(
        "95%: cluster bootstrap over targets (thick), exact bounds (thin)" if several else "95% Clopper-Pearson",
        fontsize=9,
    )
    axes[1].set_title("95% bootstrap over targets", fontsize=9)
    axes[0].legend(fontsize=7)
    if title:
        figure.suptitle(title)
    _save_figure(figure, path)


def _sweep_masks(masks: Sequence[Mapping[str, Any]], labels: Sequence[str]) -> dict[str, list[Mapping[str, Any]]]:
    """The goldfish masks that ran, grouped into one series per strategy and hash width (every k of each), sorted
    by k."""
    series: dict[str, list[Mapping[str, Any]]] = {}
    for mask in masks:
        if mask.get("strategy") is None or mask["label"] not in labels:
            continue
        name = mask["strategy"] + (f" h={mask['h']}" if mask["strategy"] == "hashed" else "")
        series.setdefault(name, []).append(mask)
    return {name: sorted(ms, key=lambda m: m["k"]) for name, ms in series.items()}


@dataclass(frozen=True)
class SweepPoint:
    """One model in the k sweep: exact match at the top bucket with its inner and outer interval (BucketPoint) and
    its validation loss with its interval (None: not measured)."""

    exact_match: float | None
    inner: Interval
    outer: Interval
    val_loss: float | None
    val_loss_ci: Interval


@dataclass(frozen=True)
class KSweep:
    """The k sweep's plot data: per series of masks (strategy and hash width) its k and one point per k, and the
    standard model's point as the reference (None: no standard model), at the top bucket."""

    top_bucket: int
    series: dict[str, tuple[list[int], list[SweepPoint]]]  # name -> (k of each mask, sorted; its points)
    standard: SweepPoint | None


def sweep_series(
    masks: Sequence[Mapping[str, Any]],
    tables: Mapping[str, Sequence[BucketPoint]],
    validation: Mapping[str, tuple[float | None, Interval]],
) -> KSweep | None:
    """Per series of masks (strategy and hash width), per k: the top bucket's exact match with its intervals and the
    validation loss with its (validation: label -> (loss, interval)); the standard model's as the reference. None
    without two k of one strategy."""
    series = _sweep_masks(masks, list(tables))
    if not any(len({m["k"] for m in ms}) >= 2 for ms in series.values()):
        return None
    top = max(e.repeats for e in next(iter(tables.values())))

    def point(label: str) -> SweepPoint:
        entry = next(e for e in tables[label] if e.repeats == top)
        loss, loss_ci = validation.get(label) or (None, None)
        return SweepPoint(entry.exact_match, entry.inner, entry.outer, loss, loss_ci)

    return KSweep(
        top_bucket=top,
        series={name: ([m["k"] for m in ms], [point(m["label"]) for m in ms]) for name, ms in series.items()},
        standard=point("standard") if "standard" in tables else None,
    )


def k_sweep_series(compared: CompareResult) -> KSweep | None:
    """The k sweep of one comparison: every goldfish mask that ran, one series per strategy (and hash width), per k
    the top bucket's exact match (Clopper-Pearson interval) and the validation loss (bootstrap interval over
    validation rows); the standard model's as the reference. None without two k of one strategy."""
    buckets = compared.buckets or {}
    if not buckets:
        return None
    tables = {label: [BucketPoint.of_bucket(e) for e in result.extraction] for label, result in buckets.items()}
    validation = {
        label: (compared.validation(label).get("loss"), compared.validation(label).get("loss_ci"))
        for label in compared.headlines
    }
    return sweep_series(compared.config.get("masks") or [], tables, validation)  # type: ignore[arg-type]


def draw_k_sweep(sweep: KSweep, path: Path) -> None:
    """Exact match at the top bucket and the validation loss against k, one marker series per mask strategy (every k
    that ran, shifted a little sideways so that two strategies at one k do not hide each other), the standard model
    as a dashed line with its interval as a band (the exact bounds a lighter band with several seeds)."""
    figure, (left, right) = new_figure(1, 2, figsize=(11, 4))
    standard = sweep.standard
    n_series = len(sweep.series)
    every_k = sorted({k for ks, _ in sweep.series.values() for k in ks})
    for i, (name, (ks, points)) in enumerate(sweep.series.items()):
        shift = 2 ** (0.08 * (i - (n_series - 1) / 2))  # a constant step on the log axis
        k = [value * shift for value in ks]
        color, marker = f"C{i % 10}", MARKERS[i % len(MARKERS)]
        em = [p.exact_match for p in points]
        if any(p.outer for p in points):
            left.errorbar(k, em, yerr=_error(em, [p.outer for p in points]), color=color, linestyle="none")
        left.errorbar(
            k,
            em,
            yerr=_error(em, [p.inner for p in points]),
            marker=marker,
            capsize=3,
            elinewidth=2,
            color=color,
            label=f"goldfish ({name})",
        )
        losses = [math.nan if p.val_loss is None else p.val_loss for p in points]
        right.errorbar(
            k,
            losses,
            yerr=_error(losses, [p.val_loss_ci for p in points]),
            marker=marker,
            capsize=3,
            color=color,
            label=f"goldfish ({name})",
        )
    if standard:
        left.axhline(standard.exact_match, color="black", linestyle="--", label="standard")
        for band, alpha in ((standard.outer, 0.05), (standard.inner, 0.1)):
            if band:
                left.axhspan(*band, color="black", alpha=alpha)
        if standard.val_loss is not None:
            right.axhline(standard.val_loss, color="black", linestyle="--", label="standard")
            if standard.val_loss_ci:
                right.axhspan(*standard.val_loss_ci, color="black", alpha=0.08)
    left.set_ylabel(f"exact match at {sweep.top_bucket} copies")
    left.set_ylim(-0.03, 1.03)
    right.set_ylabel("validation loss (95% interval)")
    for axis in (left, right):
        axis.set_xscale("log", base=2)
        axis.set_xticks(every_k, [str(k) for k in every_k])
        axis.minorticks_off()
        axis.set_xlabel("k (one token in k dropped)")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    _save_figure(figure, path)


def study_figures(compared: CompareResult, out_dir: Path) -> list[str]:
    """The bucket plot and the k sweep of one comparison, when it has them."""
    written = []
    buckets = compared.buckets or {}
    if buckets:
        draw_buckets(
            {label: [BucketPoint.of_bucket(e) for e in result.extraction] for label, result in buckets.items()},
            out_dir / BUCKETS_FILE,
        )
        written.append(BUCKETS_FILE)
    series = k_sweep_series(compared)
    if series is not None:
        draw_k_sweep(series, out_dir / K_SWEEP_FILE)
        written.append(K_SWEEP_FILE)
    return written
