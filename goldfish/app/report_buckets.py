"""report.md sections and plots of a repetition-bucket study: per bucket every measure with its interval, the tests
between models, the k sweep, and the combination of several seeds (`goldfish compare --seeds`).

Rendered from summary.json's `buckets`, `bucket_tests`, `corpus` and `models[*]["validation"]` (one seed), or from
the combined summary of `goldfish.app.compare.compare_seeds`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from data.atomic import json_safe, write_text_atomic
from eval.buckets import EXACT_MATCH_K
from eval.metrics import EXACT_MATCH, ROUGE_L, SUFFIX_LOGPROB_MEAN, interval_key
from goldfish.app.report_format import figure_link as _figure
from goldfish.app.report_format import fmt as _fmt
from goldfish.app.report_format import fmt_ci as _fmt_ci
from goldfish.app.report_format import md_table as _table
from goldfish.app.report_format import new_figure, palette
from goldfish.app.report_format import save_figure as _save_figure

K_SWEEP_FILE = "k_sweep.png"
BUCKETS_FILE = "buckets.png"


def _pct(value: Any) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _p(value: Any) -> str:
    if value is None:
        return "n/a"
    return f"{value:.2g}" if value >= 0.001 else f"{value:.1e}"


def _exact(entry: Mapping[str, Any]) -> str:
    """ "3/32 = 0.094 [0.020, 0.250]": the count, the rate and its Clopper-Pearson interval."""
    rate = _fmt_ci(entry[EXACT_MATCH], entry.get(interval_key(EXACT_MATCH)))
    return f"{entry[EXACT_MATCH_K]}/{entry['n']} = {rate}"


def study_section(summary: Mapping[str, Any], figures: Sequence[str]) -> list[str]:
    """The protocol (targets' share, spread, split) and the per-bucket tables of one comparison."""
    buckets = summary.get("buckets") or {}
    if not buckets:
        return []
    lines = ["## Per repetition bucket", ""]
    corpus = summary.get("corpus") or {}
    first = next(iter(buckets.values()))
    split = first.get("split") or {}
    prefix = split.get("prefix_len")
    lines.append(
        f"Targets are split into a prefix of {prefix if prefix else 'all but the suffix'} tokens and a suffix of "
        f"{split.get('suffix_len')} tokens, the same for every bucket. Bucket 0: held-out targets of the same pool, "
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
        "Exact match: count/targets = rate [95% Clopper-Pearson interval]; RougeL, suffix log-likelihood: mean "
        "[95% bootstrap interval over targets]; p: two-sided Fisher exact test of the exact-match counts against "
        "the standard model's.",
        "",
    ]
    tests = ((summary.get("bucket_tests") or {}).get("models")) or {}
    for label, result in buckets.items():
        p_values = {str(t["repeats"]): t.get("fisher_p") for t in tests.get(label, [])}
        membership = {str(m["repeats"]): m for m in result.get("membership") or []}
        rows = []
        for entry in result["extraction"]:
            key = str(entry["repeats"])
            attack = ((membership.get(key) or {}).get("attacks") or {}).get("loss") or {}
            rows.append(
                [
                    key,
                    _exact(entry),
                    _p(p_values.get(key)) if label in tests else "",
                    _fmt_ci(entry.get(ROUGE_L), entry.get(interval_key(ROUGE_L))),
                    _fmt_ci(entry.get(SUFFIX_LOGPROB_MEAN), entry.get(interval_key(SUFFIX_LOGPROB_MEAN))),
                    _fmt_ci(attack.get("auc"), attack.get("auc_ci")) if attack else "",
                    _fmt_ci(attack.get("tpr_at_fpr"), attack.get("tpr_at_fpr_ci")) if attack else "",
                ]
            )
        lines += [f"**{label}**", ""]
        lines += _table(
            [
                "copies",
                "exact match",
                "p vs standard",
                "RougeL",
                "suffix log-likelihood / token",
                "loss-attack AUC vs bucket 0",
                "TPR at 1% FPR",
            ],
            rows,
        )
        lines += _field_scores(result)
        lines += _prefix_table(result)
    lines += _figure(BUCKETS_FILE, "extraction by repetitions with intervals", figures)
    lines += _figure(K_SWEEP_FILE, "extraction and validation loss against k", figures)
    return lines


def _field_scores(result: Mapping[str, Any]) -> list[str]:
    lines = []
    recall = result.get("recall_at_incorrect") or {}
    if recall:
        split = result.get("split") or {}
        lines.append(
            "lm-extraction-benchmark recall of the trained targets (one greedy guess each, ranked by the model's mean "
            f"log-probability of its guess; here at {split.get('prefix_len')}/{split.get('suffix_len')} tokens, the "
            "benchmark's own split is 50/50): "
            + ", ".join(f"at {n} incorrect {_fmt(r['recall'])}" for n, r in recall.items())
            + "."
        )
    pythia = result.get("pythia")
    if pythia:
        lines.append(
            "Pythia 32/32 memorization score (mean share of the 32 suffix tokens greedy decoding reproduces; share "
            "of targets with all 32) by copies: "
            + "; ".join(f"{t['repeats']}: {_fmt(t['score'])} ({_fmt(t['memorized'])})" for t in pythia["table"])
            + "."
        )
    return lines + [""] if lines else []


def _prefix_table(result: Mapping[str, Any]) -> list[str]:
    by_prefix = result.get("prefix_length") or {}
    if not by_prefix:
        return []
    prefixes = sorted(by_prefix, key=int)
    buckets = sorted({e["repeats"] for table in by_prefix.values() for e in table})
    rows = []
    for bucket in buckets:
        cells = []
        for prefix in prefixes:
            entry = next((e for e in by_prefix[prefix] if e["repeats"] == bucket), None)
            cells.append(_exact(entry) if entry else "n/a")
        rows.append([str(bucket), *cells])
    return ["Exact match by prefix length (the suffix right after the first P tokens):", ""] + _table(
        ["copies", *(f"P = {p}" for p in prefixes)], rows
    )


# ---------------------------------------------------------------------------------------------------------- figures


def draw_buckets(tables: Mapping[str, Sequence[Mapping[str, Any]]], path: Path, title: str = "") -> None:
    """Exact match and RougeL against the copies trained on (categorical axis, 0 = held out), one line per model,
    the intervals as bands."""
    colors = palette(list(tables))
    figure, axes = new_figure(1, 2, figsize=(11, 4))
    for axis, metric, name in ((axes[0], EXACT_MATCH, "exact match"), (axes[1], ROUGE_L, "RougeL")):
        for label, table in tables.items():
            x = list(range(len(table)))
            y = [math.nan if e.get(metric) is None else e[metric] for e in table]
            axis.plot(x, y, marker="o", color=colors[label], label=label)
            ci = [e.get(interval_key(metric)) for e in table]
            if all(c for c in ci):
                axis.fill_between(x, [c[0] for c in ci], [c[1] for c in ci], color=colors[label], alpha=0.15)
        first = next(iter(tables.values()))
        axis.set_xticks(range(len(first)), [str(e["repeats"]) for e in first])
        axis.set_xlabel("copies trained on (0 = held out)")
        axis.set_ylabel(name)
        axis.set_ylim(-0.03, 1.03)
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    if title:
        figure.suptitle(title)
    _save_figure(figure, path)


def k_sweep_series(summary: Mapping[str, Any]) -> dict[str, Any] | None:
    """For masks of one strategy and hash width at two or more k: per k the top bucket's exact match (and its
    interval) and the validation loss; the standard model's as the reference. None when there is no sweep."""
    masks = [m for m in (summary.get("config") or {}).get("masks") or [] if m.get("strategy") == "hashed"]
    by_h: dict[int, list[Mapping[str, Any]]] = {}
    for mask in masks:
        by_h.setdefault(mask["h"], []).append(mask)
    sweep = max(by_h.values(), key=len, default=[])
    if len({m["k"] for m in sweep}) < 2 or not summary.get("buckets"):
        return None
    buckets = summary["buckets"]
    top = max(e["repeats"] for e in next(iter(buckets.values()))["extraction"])

    def point(label: str) -> dict[str, Any]:
        entry = next(e for e in buckets[label]["extraction"] if e["repeats"] == top)
        validation = summary["models"][label].get("validation") or {}
        return {
            EXACT_MATCH: entry[EXACT_MATCH],
            interval_key(EXACT_MATCH): entry.get(interval_key(EXACT_MATCH)),
            ROUGE_L: entry.get(ROUGE_L),
            "val_loss": validation.get("loss"),
            "val_loss_ci": validation.get("loss_ci"),
        }

    sweep = sorted((m for m in sweep if m["label"] in buckets), key=lambda m: m["k"])
    return {
        "top_bucket": top,
        "k": [m["k"] for m in sweep],
        "points": [point(m["label"]) for m in sweep],
        "standard": point("standard") if "standard" in buckets else None,
    }


def draw_k_sweep(series: Mapping[str, Any], path: Path) -> None:
    figure, (left, right) = new_figure(1, 2, figsize=(11, 4))
    k, points, standard = series["k"], series["points"], series["standard"]
    em = [p[EXACT_MATCH] for p in points]
    low = [p[EXACT_MATCH] - p[interval_key(EXACT_MATCH)][0] if p[interval_key(EXACT_MATCH)] else 0 for p in points]
    high = [p[interval_key(EXACT_MATCH)][1] - p[EXACT_MATCH] if p[interval_key(EXACT_MATCH)] else 0 for p in points]
    left.errorbar(k, em, yerr=[low, high], marker="o", capsize=3, label="goldfish (hashed)")
    if standard:
        left.axhline(standard[EXACT_MATCH], color="black", linestyle="--", label="standard")
    left.set_xscale("log", base=2)
    left.set_xlabel("k (one token in k dropped)")
    left.set_ylabel(f"exact match at {series['top_bucket']} copies")
    left.set_ylim(-0.03, 1.03)
    left.legend(fontsize=8)
    losses = [p["val_loss"] for p in points]
    if all(v is not None for v in losses):
        err = [
            [p["val_loss"] - p["val_loss_ci"][0] for p in points] if all(p["val_loss_ci"] for p in points) else None,
            [p["val_loss_ci"][1] - p["val_loss"] for p in points] if all(p["val_loss_ci"] for p in points) else None,
        ]
        right.errorbar(k, losses, yerr=None if err[0] is None else err, marker="o", capsize=3, label="goldfish")
        if standard and standard["val_loss"] is not None:
            right.axhline(standard["val_loss"], color="black", linestyle="--", label="standard")
        right.set_xscale("log", base=2)
        right.set_xlabel("k")
        right.set_ylabel("validation loss")
        right.legend(fontsize=8)
    for axis in (left, right):
        axis.grid(alpha=0.3)
    _save_figure(figure, path)


def study_figures(summary: Mapping[str, Any], out_dir: Path) -> list[str]:
    """The bucket plot and the k sweep of one comparison, when it has them."""
    written = []
    buckets = summary.get("buckets") or {}
    if buckets:
        draw_buckets({label: result["extraction"] for label, result in buckets.items()}, out_dir / BUCKETS_FILE)
        written.append(BUCKETS_FILE)
    series = k_sweep_series(summary)
    if series is not None:
        draw_k_sweep(series, out_dir / K_SWEEP_FILE)
        written.append(K_SWEEP_FILE)
    return written


# ------------------------------------------------------------------------------------------------------------ seeds


def _pooled(pooled: Mapping[str, Any]) -> str:
    """ "24/64 [0.258, 0.505]": the count over every target and seed with its Clopper-Pearson interval (the trials
    counted as independent: a target's seeds are not, so read it beside the bootstrap interval)."""
    ci = pooled.get("ci")
    return f"{pooled['k']}/{pooled['n']}" + (f" [{_fmt(ci[0])}, {_fmt(ci[1])}]" if ci else "")


def _seed_roles(summary: Mapping[str, Any]) -> list[str]:
    """Which seeds are confirmatory and which were used to choose the settings (--tuning-seeds), when any were named."""
    tuning = summary.get("tuning_seeds") or []
    if not tuning:
        return []
    confirmatory = summary.get("confirmatory_seeds_run") or []
    exploratory = summary.get("exploratory_seeds_run") or []
    return [
        f"Confirmatory seeds (played no part in choosing the settings): {', '.join(map(str, confirmatory)) or 'none'}; "
        f"seeds used in tuning: {', '.join(map(str, tuning))}"
        + (f", of which this run includes {', '.join(map(str, exploratory))}." if exploratory else " (none ran here).")
    ]


def render_seeds_markdown(summary: Mapping[str, Any], figures: Sequence[str]) -> str:
    seeds = summary["seeds"]
    config = summary["config"]
    lines = [
        "# goldfish compare over seeds",
        "",
        f"Model `{config['model']}`, seeds {', '.join(map(str, seeds))} (each: the model's initialisation, the data "
        "order and the insertion positions); every seed's own report is in its folder "
        f"({', '.join(f'`{f}/report.md`' for f in summary['folders'].values())}).",
        f"Targets per bucket: {', '.join(f'{b}: {n}' for b, n in summary['buckets']['n_per_bucket'].items())} "
        f"({summary['buckets']['assignment']}).",
        f"Combination: {summary['combination']}. The pooled column counts every target under every seed as one "
        "trial, with its exact (Clopper-Pearson) interval: it is not zero-wide where nothing was extracted, as a "
        "bootstrap of zeros is.",
        *_seed_roles(summary),
        "",
        *(f"**Warning:** {w}." for w in summary.get("warnings") or []),
    ]
    for label, entry in summary["combined"].items():
        table = entry.get("buckets")
        if not table:
            continue
        rows = [
            [
                str(e["repeats"]),
                str(e["n_targets"]),
                _fmt_ci(e[EXACT_MATCH], e.get(interval_key(EXACT_MATCH))),
                _pooled(e[f"{EXACT_MATCH}_pooled"]),
                ", ".join(_fmt(v) for v in e[f"{EXACT_MATCH}_per_seed"]),
                _fmt_ci(e[ROUGE_L], e.get(interval_key(ROUGE_L))),
                ", ".join(_fmt(v) for v in e[f"{ROUGE_L}_per_seed"]),
            ]
            for e in table
        ]
        lines += [f"**{label}**", ""]
        lines += _table(
            [
                "copies",
                "targets",
                "exact match (mean over seeds)",
                "every target and seed pooled",
                "per seed",
                "RougeL",
                "per seed",
            ],
            rows,
        )
    validation_rows = []
    for label, entry in summary["combined"].items():
        v = entry.get("validation")
        if v:
            difference = ""
            if "difference_per_seed" in v:
                difference = (
                    f"{v['difference_to_standard']:+.4f} (per seed "
                    + ", ".join(
                        f"{d:+.4f} = {100 * r:+.2f}%"
                        for d, r in zip(v["difference_per_seed"], v["relative_difference_per_seed"])
                    )
                    + ")"
                )
            validation_rows.append([label, _fmt(v["loss"]), ", ".join(_fmt(x) for x in v["per_seed"]), difference])
    if validation_rows:
        lines += ["Validation loss (held-out background):", ""]
        lines += _table(["model", "mean over seeds", "per seed", "difference to standard"], validation_rows)
        lines += _corpus_note(summary.get("corpus_per_seed"))
    lines += _figure(BUCKETS_FILE, "extraction by repetitions, mean over seeds with intervals", figures)
    lines += _figure(
        K_SWEEP_FILE, "exact match at the top bucket and validation loss against k, mean over seeds", figures
    )
    return "\n".join(lines)


def _corpus_note(per_seed: Mapping[str, Any] | None) -> list[str]:
    """The sentence under the combined validation table: per seed, the targets' share of the tokens trained and the
    validation candidates left out as twins of the background (data.background.validation_documents)."""
    if not per_seed:
        return []
    shares = ", ".join(_pct(entry["target_share"]) for entry in per_seed.values())
    removed = "; ".join(
        f"{(entry['validation_removed_copies'] or {}).get('exact_text')} exact and "
        f"{(entry['validation_removed_copies'] or {}).get('near')} near"
        for entry in per_seed.values()
    )
    return [
        "",
        f"Target copies are {shares} of the tokens trained (per seed). Validation candidates with a twin elsewhere in "
        f"the background, left out of validation and of the stream so that no validation row has a trained copy, "
        f"per seed: {removed}.",
    ]


def seeds_k_sweep_series(summary: Mapping[str, Any]) -> dict[str, Any] | None:
    """k_sweep_series of a several-seed summary: the top bucket's exact match (mean over seeds, its interval) and the
    validation loss (mean over seeds) per k."""
    combined = {label: e for label, e in summary["combined"].items() if e.get("buckets")}
    masks = [m for m in summary["config"].get("masks") or [] if m.get("strategy") == "hashed"]
    by_h: dict[int, list[Mapping[str, Any]]] = {}
    for mask in masks:
        by_h.setdefault(mask["h"], []).append(mask)
    sweep = sorted((m for m in max(by_h.values(), key=len, default=[]) if m["label"] in combined), key=lambda m: m["k"])
    if len({m["k"] for m in sweep}) < 2:
        return None
    top = max(e["repeats"] for e in next(iter(combined.values()))["buckets"])

    def point(label: str) -> dict[str, Any]:
        entry = next(e for e in combined[label]["buckets"] if e["repeats"] == top)
        validation = combined[label].get("validation") or {}
        return {
            EXACT_MATCH: entry[EXACT_MATCH],
            interval_key(EXACT_MATCH): entry.get(interval_key(EXACT_MATCH)),
            "val_loss": validation.get("loss"),
            "val_loss_ci": None,
        }

    return {
        "top_bucket": top,
        "k": [m["k"] for m in sweep],
        "points": [point(m["label"]) for m in sweep],
        "standard": point("standard") if "standard" in combined else None,
    }


def write_seeds_report(summary: Mapping[str, Any], out_dir: Path) -> list[str]:
    """OUT/summary.json, OUT/report.md, OUT/buckets.png and OUT/k_sweep.png of a several-seed comparison; returns
    the PNG names."""
    figures = []
    tables = {label: e["buckets"] for label, e in summary["combined"].items() if e.get("buckets")}
    if tables:
        draw_buckets(tables, out_dir / BUCKETS_FILE, title=f"seeds {', '.join(map(str, summary['seeds']))}")
        figures.append(BUCKETS_FILE)
    series = seeds_k_sweep_series(summary)
    if series is not None:
        draw_k_sweep(series, out_dir / K_SWEEP_FILE)
        figures.append(K_SWEEP_FILE)
    write_text_atomic(out_dir / "report.md", render_seeds_markdown(summary, figures))
    write_text_atomic(out_dir / "summary.json", json.dumps(json_safe(summary), indent=2, default=str, allow_nan=False))
    return figures
