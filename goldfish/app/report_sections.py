"""The markdown sections of the compare and eval reports (report.md): one function per table or note, each taking
the `(key cells, PartResult)` entries or the summary part it renders and returning its lines; a section whose data
is missing returns no lines, so summaries written before an instrument existed still render."""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

from eval.files import CURVE_FILE, MEMBERSHIP_FILE, ROW_FILES
from eval.metrics import (
    ANY_EXACT,
    AUC,
    AUC_CI,
    EXACT_MATCH,
    METRICS,
    ROUGE_L,
    TF_DROPPED_ACCURACY,
    TF_KEPT_ACCURACY,
    TPR_AT_FPR,
    interval_key,
)
from goldfish.app.compare_result import CompareResult
from goldfish.app.report_figures import (
    BREAKDOWNS,
    as_float,
    attack_order,
    curve_series,
)
from goldfish.app.report_format import figure_link as _figure
from goldfish.app.report_format import fmt as _fmt
from goldfish.app.report_format import fmt_ci as _fmt_ci
from goldfish.app.report_format import fmt_count, fmt_interval
from goldfish.app.report_format import md_table as _table
from goldfish.app.results import HEADLINE_KEYS, PartResult

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


def key_order(keys: Sequence[str]) -> list[str]:
    """Keys like "1", "10", "0.5" in numeric order (JSON turns numeric keys into strings)."""
    return sorted(keys, key=float)


def headline_section(key_header: list[str], entries: Sequence[Entry]) -> list[str]:
    rows = [
        keys + [_fmt_ci(s.metric(k), s.metric(interval_key(k))) for _, k in HEADLINE_COLUMNS] for keys, s in entries
    ]
    return _table(key_header + [name for name, _ in HEADLINE_COLUMNS], rows)


def replies_section(key_header: list[str], entries: Sequence[Entry]) -> list[str]:
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


def conversations(result: CompareResult) -> bool:
    """Whether a compare result's documents are conversations (their parts were extracted reply by reply)."""
    return "details" in result.keys and any(
        "replies" in part.details for model in result.models.values() for part in model.parts.values()
    )


def curves_section(curves: Mapping[str, Sequence[Mapping[str, Any]]], figures: Sequence[str]) -> list[str]:
    rows = []
    for label, s in curve_series(curves).items():
        if not s["epoch"]:
            continue
        em = as_float(s[EXACT_MATCH])
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


def divergence_section(
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


def adaptive_section(key_header: list[str], entries: Sequence[Entry]) -> list[str]:
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
                f"{_fmt(sampling.get(ANY_EXACT))} ({settings.get('n_samples', 'n/a')} samples, "
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


def probabilistic_section(key_header: list[str], entries: Sequence[Entry]) -> list[str]:
    present = [(keys, s.instruments["probabilistic"]) for keys, s in entries if "probabilistic" in s.instruments]
    if not present:
        return []
    budgets = key_order(list({k for _, p in present for k in p.get("expected_fraction_extracted", {})}))
    confidences = key_order(list({k for _, p in present for k in p.get("median_samples_needed", {})}))
    rows = []
    for keys, p in present:
        rows.append(
            keys
            + [f"T={p.get('temperature', 'n/a')}, top-p={p.get('top_p', 'n/a')}"]
            + [_fmt(p.get("expected_fraction_extracted", {}).get(n)) for n in budgets]
            + [fmt_count(p.get("median_samples_needed", {}).get(c)) for c in confidences]
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


def membership_section(key_header: list[str], entries: Sequence[Entry], figures: Sequence[str]) -> list[str]:
    present = [(keys, result) for keys, result in entries if result.get("attacks")]
    if not present:
        return []
    attacks = attack_order({a for _, result in present for a in result["attacks"]})
    fprs = sorted(
        {k for _, r in present for m in r["attacks"].values() for k in m.get(TPR_AT_FPR, {})}, key=float, reverse=True
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
                + [attack, _fmt_ci(metrics.get(AUC), metrics.get(AUC_CI))]
                + [_fmt(metrics.get(TPR_AT_FPR, {}).get(f)) for f in fprs]
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


def breakdown_sections(
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


def files_section(files: Sequence[str]) -> list[str]:
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


def documents_section(docs: Mapping[str, Any]) -> list[str]:
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


def rouge_notes(parts: Iterable[PartResult]) -> list[str]:
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


def _difference_cell(entry: Mapping[str, Any]) -> str:
    """A loss entry's paired difference to the standard model with its interval and relative size ("" for the
    standard model itself)."""
    if entry.get("difference_to_standard") is None:
        return ""
    return (
        f"{_fmt_ci(entry['difference_to_standard'], entry.get('difference_ci'))} "
        f"({100 * entry['relative_difference']:+.2f}%)"
    )


def heldout_loss_section(result: CompareResult) -> list[str]:
    """The cost side of every comparison: each model's loss on the held-out documents, never trained on."""
    rows = []
    for label, parts in result.headlines.items():
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


def validation_section(result: CompareResult, figures: Sequence[str]) -> list[str]:
    """Validation loss on the held-out background (--background runs): utility beside memorization."""
    rows = []
    for label, parts in result.headlines.items():
        if "validation" not in parts:
            continue
        v = parts["validation"]
        rows.append([label, _fmt_ci(v["loss"], v.get("loss_ci")), _fmt(v["perplexity"]), _difference_cell(v)])
    if not rows:
        return []
    corpus: Any = result.corpus or {}
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


def fmt_seconds(value: Any) -> str:
    return f"{value:.1f}" if isinstance(value, (int, float)) else _fmt(value)
