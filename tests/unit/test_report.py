"""Reports of `goldfish compare` and `goldfish eval`: every section's numbers land in the right table row, every
plot is a real PNG built from the right series, and summaries without the optional sections still render.

All summaries are built by hand here (no training), so the expected cells are known exactly.
"""

import json
import math
from pathlib import Path

import pytest

from data.atomic import json_safe
from goldfish.app.compare_result import CompareResult
from goldfish.app.eval_result import EvalResult
from goldfish.app.report import (
    render_eval_markdown,
    render_markdown,
    write_compare_report,
    write_eval_report,
)
from goldfish.app.report_figures import (
    _bucket_tick_labels,
    bar_series,
    breakdown_series,
    curve_series,
    divergence_series,
    draw_bars,
    draw_breakdown,
    roc_series,
    rouge_hist_series,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
LABELS = ("control", "standard", "goldfish-k4")
ATTACKS = ("loss", "zlib", "min_k", "reference", "min_k_pp", "grad_norm", "recall", "dc_pdd")


def _part(em: float, rouge: float, n: int = 8) -> dict:
    return {
        "n_docs": n,
        "exact_match": em,
        "rouge_l": rouge,
        "rouge_l_recall": rouge,
        "rouge_1": rouge,
        "rouge_2": rouge / 2,
        "match_fraction": em,
        "longest_correct_prefix": 8 * em,
        "tf_accuracy": 0.5,
        "config": {"suffix_len": 10, "prefix_len": None, "batch_size": 4},
    }


def _attack(auc: float, tpr_1: float, tpr_01: float) -> dict:
    return {
        "auc": auc,
        "tpr_at_fpr": {"0.01": tpr_1, "0.001": tpr_01},
        "roc": {"fpr": [0.0, 0.0, 0.5, 1.0], "tpr": [0.0, tpr_1, auc, 1.0]},
        "n_members": 8,
        "n_nonmembers": 8,
        "fpr_resolution": 0.125,
    }


def _membership(auc: float, with_reference: bool) -> dict:
    attacks = {a: _attack(auc, 0.5, 0.25) for a in ATTACKS if with_reference or a != "reference"}
    return {"attacks": attacks, "orientation": "higher score = member", "min_k": 0.2}


def _old_summary() -> dict:
    """The schema before the extra instruments: headline numbers, plain details, no membership."""
    headline = {"control": (0.0, 0.1), "standard": (0.75, 0.9), "goldfish-k4": (0.0, 0.4)}
    models = {label: {"train": _part(*headline[label]), "heldout": _part(0.0, 0.05)} for label in LABELS}
    return {
        "models": models,
        "details": json.loads(json.dumps(models)),
        "config": {
            "model": "tiny-llama",
            "init_seed": 0,
            "data": {"source": "default", "n_train": 8, "n_heldout": 8, "seq_len": 96, "seed": 0},
            "train": {"epochs": 3, "batch_size": 8, "lr": 0.003, "schedule": "cosine", "precision": "fp32"},
            "extraction": {"suffix_len": 10, "prefix_len": None, "batch_size": 4},
        },
        "documents": {"train": [{"id": f"t{i}"} for i in range(8)], "heldout": [{"id": f"h{i}"} for i in range(8)]},
        "control": "the initial weights",
        "timings_s": {"total": 12.34},
    }


def _full_summary() -> dict:
    summary = _old_summary()
    details = summary["details"]
    for label in LABELS:
        for part in ("train", "heldout"):
            s = details[label][part]
            s["divergence"] = {
                "n_docs": 8,
                "n_diverged": 8,
                "mean_first_divergence": 0.0,
                "first_divergence_histogram": {"0": 8},
                "n_on_dropped": 2,
                "share_on_dropped": 0.25,
                "share_expected_by_chance": 0.25,
            }
            s["probabilistic"] = {
                "n_docs": 8,
                "temperature": 1.0,
                "top_p": 1.0,
                "expected_fraction_extracted": {"1": 0.0, "10": 0.0, "100": 0.0, "1000": 0.0},
                "median_samples_needed": {"0.5": math.inf, "0.9": math.inf, "0.99": math.inf},
                "fraction_q_at_least_half": 0.0,
                "mean_log10_q": -60.0,
            }
            s["beam"] = {"n_docs": 8, "num_beams": 30, "exact_match": 0.0, "rouge_l": 0.2}
            s["sampling"] = {
                "n_docs": 8,
                "any_exact": 0.0,
                "best_match_fraction": 0.1,
                "sample_exact_rate": 0.0,
                "sampling": {"n_samples": 10, "temperature": 0.7, "top_p": 0.9, "seed": 0},
            }
    standard = details["standard"]["train"]
    standard["beam"].update(exact_match=0.625, rouge_l=0.95)
    standard["sampling"].update(any_exact=0.5, sample_exact_rate=0.3125, best_match_fraction=0.875)
    standard["probabilistic"].update(
        expected_fraction_extracted={"1": 0.0125, "10": 0.1234, "100": 0.5, "1000": 0.75},
        median_samples_needed={"0.5": 3.0, "0.9": 12345678.0, "0.99": math.inf},
        fraction_q_at_least_half=0.375,
        mean_log10_q=-2.5,
    )
    # Goldfish on training documents: 5 of 8 diverge (at suffix positions 0, 0, 3, 3, 3), 3 never; 4 of 5 on a
    # dropped token against 1/4 by chance.
    details["goldfish-k4"]["train"]["divergence"] = {
        "n_docs": 8,
        "n_diverged": 5,
        "mean_first_divergence": 1.8,
        "first_divergence_histogram": {"0": 2, "3": 3},
        "n_on_dropped": 4,
        "share_on_dropped": 0.8,
        "share_expected_by_chance": 0.25,
    }
    summary["curves"] = {
        # Out of order on purpose: the series must sort by epoch.
        "standard": [
            {"epoch": e, "step": 2 * e, "exact_match": em, "rouge_l": r, "n_docs": 8}
            for e, em, r in ((2, 0.5, 0.8), (0, 0.0, 0.1), (3, 0.75, 0.9), (1, 0.25, 0.5))
        ],
        "goldfish-k4": [
            {"epoch": e, "step": 2 * e, "exact_match": 0.0, "rouge_l": 0.1 * e, "n_docs": 8} for e in range(4)
        ],
    }
    summary["breakdowns"] = {
        "prefix_length": {
            label: [
                {"prefix_len": p, "n_docs": 8, "exact_match": em, "rouge_l": em} for p, em in ((16, 0.125), (32, 0.25))
            ]
            for label in LABELS
        },
        "repeats": {
            "standard": [
                {"repeats": 1, "n_docs": 2, "exact_match": 0.5, "rouge_l": 0.75},
                {"repeats": 4, "n_docs": 2, "exact_match": 1.0, "rouge_l": 1.0},
                {"repeats": None, "n_docs": 4, "exact_match": 0.0, "rouge_l": 0.1},
            ],
            "goldfish-k4": [
                {"repeats": 1, "n_docs": 2, "exact_match": 0.0, "rouge_l": 0.25},
                {"repeats": 4, "n_docs": 2, "exact_match": 0.0, "rouge_l": 0.5},
                {"repeats": None, "n_docs": 4, "exact_match": 0.0, "rouge_l": 0.1},
            ],
        },
    }
    summary["membership"] = {
        "control": _membership(0.5, with_reference=False),
        "standard": _membership(0.875, with_reference=True),
        "goldfish-k4": _membership(0.75, with_reference=True),
    }
    return summary


def _table_rows(markdown: str, heading: str) -> list[list[str]]:
    """Cells of the table under `heading`, header row included, separator row left out."""
    lines = markdown.split(heading + "\n", 1)[1].splitlines()
    rows, started = [], False
    for line in lines:
        if line.startswith("|"):
            started = True
            if not line.startswith("|---"):
                rows.append([cell.strip() for cell in line.strip("|").split("|")])
        elif started:
            break
    return rows


def _row(rows: list[list[str]], *keys: str) -> dict[str, str]:
    """The row whose leading cells are `keys`, as {column header: cell}."""
    header = rows[0]
    for row in rows[1:]:
        if row[: len(keys)] == list(keys):
            return dict(zip(header, row))
    raise AssertionError(f"no row {keys} in {rows}")


def _write_rows(out: Path, relative: str, rows: list[dict]) -> None:
    path = out / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_MAGIC, f"{path} is not a PNG"
    assert path.stat().st_size > 1000  # a blank 1-pixel PNG is ~70 bytes; a drawn figure is tens of kB


# ----------------------------------------------------------------------------------------------------- compare view


def test_compare_markdown_puts_each_number_in_its_row():
    summary = _full_summary()
    summary["membership"]["standard"]["attacks"]["recall"]["auc_ci"] = [0.7, 1.0]
    summary["models"]["standard"]["train"]["exact_match_ci"] = [0.5, 1.0]
    md = render_markdown(CompareResult.from_json(summary))
    assert "| standard | train | 8 | 0.750 [0.500, 1.000] |" in md  # the headline table's exact match interval

    adaptive = _table_rows(md, "## Adaptive extraction")
    standard = _row(adaptive, "standard", "train")
    assert standard["greedy EM"] == "0.750"
    assert standard["beam EM"] == "0.625 (width 30)"
    assert standard["beam RougeL"] == "0.950"
    assert standard["sampling any exact"] == "0.500 (10 samples, T=0.7, top-p=0.9)"
    assert standard["sample exact rate"] == "0.312"  # 0.3125 rounds half to even at 3 decimals
    assert _row(adaptive, "goldfish-k4", "train")["beam EM"] == "0.000 (width 30)"

    probabilistic = _table_rows(md, "## Probabilistic extraction")
    row = _row(probabilistic, "standard", "train")
    assert row["extracted, n=10"] == "0.123" and row["extracted, n=1000"] == "0.750"
    assert row["samples for p=0.5"] == "3" and row["samples for p=0.9"] == "1.23e+07"
    assert row["samples for p=0.99"] == "inf"
    assert row["q >= 0.5"] == "0.375" and row["mean log10 q"] == "-2.500"
    # Budgets in numeric order, not string order ("1000" < "100" would be wrong).
    assert [h for h in probabilistic[0] if h.startswith("extracted")] == [
        "extracted, n=1",
        "extracted, n=10",
        "extracted, n=100",
        "extracted, n=1000",
    ]

    divergence = _row(_table_rows(md, "## Divergence"), "goldfish-k4", "train")
    assert divergence["diverged"] == "5/8" and divergence["never diverged"] == "3"
    assert divergence["mean first divergence"] == "1.800"
    assert divergence["share on dropped"] == "0.800" and divergence["by chance"] == "0.250"

    curves = _row(_table_rows(md, "## Extraction over training"), "standard")
    assert curves["epochs (points)"] == "0-3 (4)"
    assert curves["EM first"] == "0.000" and curves["EM last"] == "0.750"
    assert curves["EM peak"] == "0.750 (epoch 3)" and curves["first epoch with EM > 0"] == "1"
    assert _row(_table_rows(md, "## Extraction over training"), "goldfish-k4")["first epoch with EM > 0"] == "n/a"

    repeats = _table_rows(md, "## Breakdown by times repeated in training")
    assert repeats[0] == ["model", "1x (n=2)", "4x (n=2)", "n/a (n=4)"]
    assert _row(repeats, "standard")["1x (n=2)"] == "0.500 / 0.750"
    assert _row(repeats, "goldfish-k4")["4x (n=2)"] == "0.000 / 0.500"
    prefix = _table_rows(md, "## Breakdown by prefix length (tokens)")
    assert _row(prefix, "control")["P=32 (n=8)"] == "0.250 / 0.250"

    membership = _table_rows(md, "## Membership inference")
    assert membership[0][:5] == ["model", "attack", "AUC [95% CI]", "TPR @ 1% FPR", "TPR @ 0.1% FPR"]
    reference = _row(membership, "standard", "reference")
    assert reference["AUC [95% CI]"] == "0.875" and reference["TPR @ 0.1% FPR"] == "0.250"
    assert _row(membership, "standard", "recall")["AUC [95% CI]"] == "0.875 [0.700, 1.000]"
    assert [r[1] for r in membership[1:] if r[0] == "control"] == [  # no reference model
        "loss",
        "zlib",
        "min_k",
        "min_k_pp",
        "grad_norm",
        "recall",
        "dc_pdd",
    ]
    assert "steps of 1/n (here 0.125)" in md


def test_markdown_is_the_same_after_a_strict_json_round_trip():
    # Result files spell infinities and NaN as strings ("inf", "nan"); the report must read them as numbers.
    summary = _full_summary()
    summary["details"]["goldfish-k4"]["train"]["probabilistic"]["mean_log10_q"] = math.nan
    stored = json.loads(json.dumps(json_safe(summary), allow_nan=False))
    assert stored["details"]["standard"]["train"]["probabilistic"]["median_samples_needed"]["0.99"] == "inf"
    md = render_markdown(CompareResult.from_json(stored))
    assert md == render_markdown(CompareResult.from_json(summary))
    assert _row(_table_rows(md, "## Probabilistic extraction"), "goldfish-k4", "train")["mean log10 q"] == "n/a"
    assert _row(_table_rows(md, "## Probabilistic extraction"), "control", "train")["samples for p=0.5"] == "inf"


def test_write_compare_report_writes_every_plot_and_lists_only_existing_files(tmp_path):
    summary = _full_summary()
    for label in LABELS:
        _write_rows(tmp_path, f"{label}/eval/train/extraction.jsonl", [{"id": "a", "rouge_l": 0.5}])
    _write_rows(tmp_path, "standard/eval/train/beam.jsonl", [{"id": "a"}])
    _write_rows(tmp_path, "standard/eval/membership.jsonl", [{"id": "a"}])

    figures = write_compare_report(CompareResult.from_json(summary), tmp_path)

    expected = {
        "compare.png",
        "rouge_hist.png",
        "em_vs_epochs.png",
        "divergence.png",
        "roc.png",
        "roc_loss.png",
        "auc.png",
        "breakdown_prefix.png",
        "breakdown_repeats.png",
    }
    assert set(figures) == expected
    for name in expected:
        _assert_png(tmp_path / name)
    md = (tmp_path / "report.md").read_text()
    for name in expected - {"roc_loss.png"}:  # roc_loss.png is kept for older links; roc.png holds it too
        assert f"]({name})" in md
    assert not [p.name for p in tmp_path.iterdir() if ".partial" in p.name]  # atomic writes leave no staging file
    # Only files on disk are listed: beam.jsonl for one folder, no divergence.jsonl anywhere.
    files = md.split("## Per-document rows", 1)[1]
    assert "`standard/eval/train/`: `extraction.jsonl` (greedy extraction), `beam.jsonl`" in files
    assert "`standard/eval/`: `membership.jsonl`" in files
    assert "divergence.jsonl" not in files and "heldout" not in files
    stored = json.loads((tmp_path / "summary.json").read_text(), parse_constant=pytest.fail)  # strict: no Infinity
    assert stored["details"]["standard"]["train"]["beam"]["exact_match"] == 0.625
    assert stored["details"]["control"]["train"]["probabilistic"]["median_samples_needed"]["0.5"] == "inf"


def test_old_summary_without_optional_sections_still_renders(tmp_path):
    summary = _old_summary()
    md = render_markdown(CompareResult.from_json(summary))
    for heading in (
        "## Extraction over training",
        "## Divergence",
        "## Adaptive extraction",
        "## Probabilistic extraction",
        "## Breakdown",
        "## Membership inference",
    ):
        assert heading not in md
    assert _row(_table_rows(md, "# goldfish compare"), "standard", "train")["exact match"] == "0.750"
    assert "Timings (s): total 12.3" in md
    assert "Warning" not in md
    summary["warnings"] = ["the untrained control already extracts 0.250 of the training documents"]
    assert "**Warning:** the untrained control already extracts 0.250 of the training documents." in render_markdown(
        CompareResult.from_json(summary)
    )
    del summary["warnings"]

    figures = write_compare_report(CompareResult.from_json(summary), tmp_path)  # no extraction.jsonl: no histogram
    assert figures == ["compare.png"]
    _assert_png(tmp_path / "compare.png")
    written = (tmp_path / "report.md").read_text()
    assert "rouge_hist.png" not in written and "roc" not in written and "## Per-document rows" not in written

    # Older still: headline numbers only, no details, an empty membership.
    del summary["details"]
    summary["membership"] = {}
    assert "## Membership inference" not in render_markdown(CompareResult.from_json(summary))


# ----------------------------------------------------------------------------------------------------------- series


def test_curve_series_sorts_points_by_epoch():
    series = curve_series(_full_summary()["curves"])
    assert series["standard"] == {
        "epoch": [0, 1, 2, 3],
        "step": [0, 2, 4, 6],
        "exact_match": [0.0, 0.25, 0.5, 0.75],
        "rouge_l": [0.1, 0.5, 0.8, 0.9],
    }


def test_divergence_series_counts_every_position_of_the_suffix():
    divergence = _full_summary()["details"]["goldfish-k4"]["train"]["divergence"]
    series = divergence_series({"goldfish-k4": divergence}, suffix_len=10)["goldfish-k4"]
    assert series["positions"] == list(range(10))
    assert series["counts"] == [2, 0, 0, 3, 0, 0, 0, 0, 0, 0]
    assert series["n_docs"] == 8 and series["n_never"] == 3
    # In-memory summaries have int keys, JSON-read ones string keys; a divergence past suffix_len widens the axis.
    wide = divergence_series({"m": {"n_docs": 2, "n_diverged": 2, "first_divergence_histogram": {12: 2}}}, 10)
    assert wide["m"]["positions"] == list(range(13)) and wide["m"]["counts"][12] == 2 and sum(wide["m"]["counts"]) == 2


def test_roc_series_has_every_attack_in_order():
    series = roc_series(_full_summary()["membership"])
    assert list(series) == list(ATTACKS)
    assert set(series["reference"]) == {"standard", "goldfish-k4"}
    assert series["loss"]["standard"] == {"fpr": [0.0, 0.0, 0.5, 1.0], "tpr": [0.0, 0.5, 0.875, 1.0], "auc": 0.875}


def test_breakdown_series_sorts_groups_and_leaves_out_untagged_documents():
    series = breakdown_series(_full_summary()["breakdowns"]["repeats"], "repeats")
    assert series["standard"] == {
        "x": [1, 4],
        "exact_match": [0.5, 1.0],
        "rouge_l": [0.75, 1.0],
        "n_docs": [2, 2],
        "exact_match_ci": [None, None],  # rows without intervals: the plot draws no error bars
        "rouge_l_ci": [None, None],
    }


def test_rouge_hist_and_bar_series(tmp_path):
    _write_rows(tmp_path, "a.jsonl", [{"rouge_l": 0.25}, {"rouge_l": 1.0}])
    assert rouge_hist_series({"a": tmp_path / "a.jsonl", "missing": tmp_path / "none.jsonl"}) == {"a": [0.25, 1.0]}
    bars = bar_series(_old_summary()["models"])
    assert bars["exact_match"] == {"train": [0.0, 0.75, 0.0], "heldout": [0.0, 0.0, 0.0]}
    assert bars["rouge_l"]["train"] == [0.1, 0.9, 0.4]


# ---------------------------------------------------------------------------------------------------- plot layout


def _png_size(path: Path) -> tuple[int, int]:
    """(width, height) in pixels, from the PNG's IHDR chunk."""
    header = path.read_bytes()[:24]
    return int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")


def test_plots_of_every_attack_fit_a_normal_width(tmp_path):
    write_compare_report(
        CompareResult.from_json(_full_summary()), tmp_path
    )  # 8 attacks: one row of 8 ROC panels was 3,696 px wide
    for name in ("roc.png", "auc.png", "compare.png", "divergence.png", "breakdown_repeats.png"):
        width, height = _png_size(tmp_path / name)
        assert width <= 1600, f"{name} is {width} px wide"
    width, height = _png_size(tmp_path / "roc.png")
    assert height > width / 3  # panels in a grid (2 rows of 4), not a strip


def test_zero_bars_are_drawn(tmp_path):
    """A zero exact match must show in compare.png: a bar of height 0 draws nothing, so the plot marks its value."""
    import matplotlib.image

    draw_bars(["goldfish"], {"exact_match": {"train": [0.0]}, "rouge_l": {"train": [0.0]}}, tmp_path / "b.png")
    pixels = matplotlib.image.imread(tmp_path / "b.png")[..., :3]
    lower = pixels[pixels.shape[0] // 2 :]  # the legend (also in the bar colour) sits in the upper half
    bar_colour = [0x1F / 255, 0x77 / 255, 0xB4 / 255]  # matplotlib's C0, the first part's colour
    assert (abs(lower - bar_colour).max(axis=-1) < 0.02).sum() > 100


def test_divergence_series_has_the_share_on_dropped_against_chance():
    divergence = _full_summary()["details"]["goldfish-k4"]["train"]["divergence"]
    series = divergence_series({"goldfish-k4": divergence}, suffix_len=10)["goldfish-k4"]
    assert series["n_on_dropped"] == 4 and series["n_diverged"] == 5
    assert series["share_on_dropped"] == 0.8 and series["share_chance"] == 0.25
    # Clopper-Pearson for 4 of 5: beta quantiles, 0.2836 and 0.9949 (e.g. R's binom.test(4, 5)$conf.int)
    assert series["share_ci"] == pytest.approx([0.28358, 0.99495], abs=1e-5)
    none = divergence_series({"m": dict(divergence, n_on_dropped=0, share_on_dropped=0.0)})["m"]
    assert none["share_ci"] == pytest.approx([0.0, 0.52182], abs=1e-5)  # 0 of 5: 1 - 0.025 ** (1 / 5)
    # a summary's own interval wins; summaries without the mask's flags have no share to plot
    own = divergence_series({"m": dict(divergence, share_on_dropped_ci=[0.5, 0.9])})["m"]
    assert own["share_ci"] == [0.5, 0.9]
    bare = divergence_series({"m": {"n_docs": 2, "n_diverged": 1, "first_divergence_histogram": {0: 1}}})["m"]
    assert bare["share_on_dropped"] is None and bare["share_ci"] is None and bare["share_chance"] is None


def test_repeat_buckets_on_a_categorical_axis_with_intervals(tmp_path):
    """Buckets 0 (held out), 1, 4, 16, 64 evenly spaced, each with its n; rows with `<metric>_ci` get error bars."""
    rows = [
        {"repeats": r, "n_docs": 32, "exact_match": em, "rouge_l": em, "exact_match_ci": [0.0, em + 0.1]}
        for r, em in ((64, 0.9), (0, 0.0), (1, 0.0), (4, 0.1), (16, 0.4))
    ]
    plain = [{"repeats": r, "n_docs": 32 if r else 30, "exact_match": 0.0, "rouge_l": 0.1} for r in (0, 1, 4, 16, 64)]
    series = breakdown_series({"standard": rows, "goldfish": plain}, "repeats")
    assert series["standard"]["x"] == [0, 1, 4, 16, 64]
    assert series["standard"]["exact_match_ci"][-1] == [0.0, 1.0]
    assert series["standard"]["rouge_l_ci"] == [None] * 5 and series["goldfish"]["exact_match_ci"] == [None] * 5
    # n printed under a bucket only where every model has the same n (bucket 0 has 32 and 30 here)
    assert _bucket_tick_labels(series, [0.0, 1.0, 4.0, 16.0, 64.0]) == [
        "0 (held out)",
        "1\nn=32",
        "4\nn=32",
        "16\nn=32",
        "64\nn=32",
    ]
    draw_breakdown(series, tmp_path / "r.png", "times repeated in training", categorical=True)
    draw_breakdown(series, tmp_path / "n.png", "times repeated in training")  # numeric (symlog) axis
    _assert_png(tmp_path / "r.png")
    _assert_png(tmp_path / "n.png")


# -------------------------------------------------------------------------------------------------------- eval view


def _eval_summary() -> dict:
    full = _full_summary()
    train = dict(full["details"]["standard"]["train"])
    del train["divergence"]
    train["breakdowns"] = {
        "repeats": full["breakdowns"]["repeats"]["standard"],
        "prefix_length": full["breakdowns"]["prefix_length"]["standard"],
    }
    return {"train": train, "heldout": _part(0.0, 0.05), "membership": full["membership"]["standard"]}


def test_eval_markdown_and_files(tmp_path):
    summary = _eval_summary()
    md = render_eval_markdown(EvalResult.from_json(summary))
    assert md.startswith("# goldfish eval") and "Documents: train 8, heldout 8." in md
    assert _row(_table_rows(md, "## Adaptive extraction"), "train")["beam EM"] == "0.625 (width 30)"
    assert _row(_table_rows(md, "## Probabilistic extraction"), "train")["extracted, n=10"] == "0.123"
    assert _row(_table_rows(md, "## Breakdown by times repeated in training"), "train")["4x (n=2)"] == "1.000 / 1.000"
    assert _row(_table_rows(md, "## Membership inference"), "reference")["AUC [95% CI]"] == "0.875"
    assert "## Divergence" not in md  # the eval summary's parts carry no divergence here

    _write_rows(tmp_path, "train/extraction.jsonl", [{"id": "a", "rouge_l": 0.5}])
    _write_rows(tmp_path, "heldout/extraction.jsonl", [{"id": "b", "rouge_l": 0.0}])
    _write_rows(tmp_path, "train/probabilistic.jsonl", [{"id": "a"}])
    _write_rows(tmp_path, "train/prefix_length.jsonl", [{"id": "a", "prefix_len": 16}])
    _write_rows(tmp_path, "membership.jsonl", [{"id": "a"}])
    summary["train"]["divergence"] = _full_summary()["details"]["goldfish-k4"]["train"]["divergence"]
    figures = write_eval_report(EvalResult.from_json(summary), tmp_path)
    assert set(figures) == {
        "headline.png",
        "rouge_hist.png",
        "divergence.png",
        "roc.png",
        "auc.png",
        "breakdown_prefix.png",
        "breakdown_repeats.png",
    }
    for name in figures:
        _assert_png(tmp_path / name)
        assert f"]({name})" in (tmp_path / "report.md").read_text()
    written = (tmp_path / "report.md").read_text()
    assert "`train/`: `extraction.jsonl` (greedy extraction), `probabilistic.jsonl`" in written
    assert "`prefix_length.jsonl` (greedy extraction at each fixed prefix length)" in written
    assert "`heldout/`: `extraction.jsonl`" in written and "`./`: `membership.jsonl`" in written
    assert _row(_table_rows(written, "## Divergence"), "train")["never diverged"] == "3"
    assert not (tmp_path / "summary.json").exists()  # the CLI writes the eval summary itself


def test_eval_report_of_a_bare_summary_and_bad_input(tmp_path):
    bare = {"train": {"n_docs": 3, "exact_match": 1.0, "rouge_l": 1.0}}
    md = render_eval_markdown(EvalResult.from_json(bare))
    assert _row(_table_rows(md, "# goldfish eval"), "train")["exact match"] == "1.000"
    assert _row(_table_rows(md, "# goldfish eval"), "train")["TF acc kept"] == "n/a"
    # no extraction.jsonl on disk: only the headline bars, drawn from the summary
    assert write_eval_report(EvalResult.from_json(bare), tmp_path) == ["headline.png"]
    with pytest.raises(ValueError, match="no part summary"):
        EvalResult.from_json({"membership": {}})


def test_compare_report_lists_removed_duplicates_and_flags_non_latin_rouge():
    from goldfish.app.report import render_markdown

    summary = _full_summary()
    summary["documents"] = dict(
        summary["documents"],
        dedup={
            "mode": "near",
            "duplicates": "drop",
            "threshold": 0.8,
            "similarity": "Jaccard of word 5-gram shingles",
            "normalization": "lower-cased, punctuation removed",
        },
        n_removed=2,
        n_repeats=0,
        heldout_train_overlap={"ngram_words": 8, "max_fraction": 0.083, "mean_fraction": 0.006, "heldout_id": "h3"},
        removed=[
            {
                "id": "else",
                "twin": "if",
                "kind": "exact-text",
                "similarity": 1.0,
                "matched": "if",
                "side": "train",
                "action": "dropped",
            },
            {
                "id": "t9",
                "twin": "t1",
                "kind": "near",
                "similarity": 0.85,
                "matched": "t8",
                "side": "heldout",
                "action": "dropped",
            },
        ],
    )
    label = next(iter(summary["details"]))
    summary["details"][label]["heldout"]["rouge"] = {"default_tokenizer_discards_most": {"n_docs": 1, "ids": ["he"]}}
    text = render_markdown(CompareResult.from_json(summary))
    assert "## Duplicates" in text and "Deduplication `near`" in text and "near-duplicates at threshold 0.8" in text
    assert "exact text (lower-cased, punctuation removed)" in text  # the run record's normalization
    assert "| else | if | exact-text | 1.000 | train | dropped |" in text
    assert "| t9 | t1 | near (via t8) | 0.850 | heldout | dropped |" in text
    assert "at most 0.083 (mean 0.006)" in text and "`h3`" in text
    assert "discards most characters of 1 reference text(s) (first: `he`)" in text
