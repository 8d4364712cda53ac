"""The command line: --help of every subcommand, train -> eval round trip, mask, bad input, and compare --quick."""

import argparse
import json
import math
import subprocess
import sys

import pytest
from statistics_recompute import check_one_seed
from tiny_runs import tiny_run

from goldfish.app.cli import build_parser, main

SUBCOMMANDS = ["train", "eval", "compare", "plan", "mask"]


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_help_of_every_subcommand(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert "usage: goldfish " + command in capsys.readouterr().out


def test_console_entry_point_runs():
    result = subprocess.run([sys.executable, "-m", "goldfish", "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0
    for command in SUBCOMMANDS:
        assert command in result.stdout


def test_every_compare_preset_parses():
    from goldfish.app.cli import parse_command_line
    from goldfish.app.commands.compare import compare_spec
    from goldfish.app.presets import COMPARE_PRESETS, preset_spec

    args = parse_command_line(["compare", "--quick"])
    spec = compare_spec(args, None)
    assert args.quick and args.masks == ["hashed:4:13"] and spec.data.n_train == preset_spec("quick").data.n_train
    for name in COMPARE_PRESETS:
        assert parse_command_line(["compare", "--preset", name]).preset == name


def _help_of(argv: list[str], capsys) -> str:
    """The --help text of a subcommand, its whitespace collapsed (argparse wraps lines at the terminal width)."""
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    return " ".join(capsys.readouterr().out.split())


def test_preset_help_says_what_each_preset_sets(capsys):
    """Every preset has a description whose numbers come from the spec it makes (the corpus preset's help once said
    1/4/16/64 copies while the preset inserted 1/32/128/512), and compare --help prints it."""
    from goldfish.app.commands.compare import PRESET_DESCRIPTIONS, option_values, preset_description, preset_options
    from goldfish.app.presets import COMPARE_PRESETS, preset_spec

    assert set(COMPARE_PRESETS) <= set(PRESET_DESCRIPTIONS), "describe the new preset in commands/compare.py"
    text = _help_of(["compare"], capsys)
    for name in COMPARE_PRESETS:
        sets, values = preset_options(name), option_values(preset_spec(name))
        description = preset_description(name)
        assert not description.startswith("sets "), f"{name}: its description names a value the preset lacks"
        assert f"{name}: {description}" in text
        # the run's size: documents, their length, its length in steps (or epochs where steps are not capped)
        keys = [k for k in ("n_train", "n_heldout", "seq_len", "max_steps", "lora_rank", "beams") if k in sets]
        keys += [] if "max_steps" in sets else ["epochs"]
        for key in keys:
            assert str(values[key]) in description, f"{name}: {key} = {values[key]} not in {description!r}"
        if "repeats" in sets:
            assert ",".join(str(r) for r in values["repeats"]) + " cop" in description
        for mask in values.get("masks", []):
            assert mask in description


@pytest.mark.parametrize("command", ["train", "eval", "compare"])
def test_model_help_says_what_smollm2_is(command, capsys):
    """smollm2-135m is the Instruct model's Q4_1 GGUF, dequantized: --help says so, not "the pretrained SmolLM2"."""
    text = _help_of([command], capsys)
    assert "smollm2-135m (SmolLM2-135M-Instruct quantized to Q4_1" in text and "dequantized to float32" in text


def test_preset_sets_only_what_the_user_left_at_default():
    from goldfish.app.cli import parse_command_line
    from goldfish.app.commands.compare import compare_spec

    args = parse_command_line(["compare", "--preset", "smollm2", "--epochs", "3", "--lr=1e-3", "--batch-size", "2"])
    assert args.epochs == 3 and args.lr == 1e-3 and args.batch_size == 2  # typed by the user: kept
    spec = compare_spec(args, None)  # the configuration compare would run, resolved without training
    assert spec.model == "smollm2-135m" and [(m.k, m.h) for m in spec.masks] == [(3, 13), (4, 13)]
    assert spec.data.n_train == 8 and spec.train.schedule == "constant"  # the preset's
    assert (spec.train.epochs, spec.train.lr, spec.train.batch_size) == (3, 1e-3, 2)
    # a typed value equal to the parser's default still wins over the preset (smollm2 sets lr 3e-4, warmup 0)
    default_warmup = parse_command_line(["compare"]).warmup_steps
    spec = compare_spec(
        parse_command_line(["compare", "--preset", "smollm2", f"--warmup-steps={default_warmup}"]), None
    )
    assert spec.train.warmup_steps == default_warmup != 0 and spec.train.lr == 3e-4
    assert compare_spec(parse_command_line(["compare", "--quick", "--epochs", "7"]), None).train.epochs == 7


@pytest.mark.parametrize(
    "argv, meant",
    [
        (["compare", "--preset", "smollm2", "--epoch", "3"], "--epochs"),  # was read as --epochs, then overridden
        (["compare", "--quick", "--lr-sched", "constant"], None),
        (["train", "--out", "x", "--epoch", "3"], "--epochs"),
        (["eval", "--out", "o", "--model", "m", "--suffix", "32"], "--suffix-len"),
    ],
)
def test_abbreviated_options_are_refused(argv, meant, capsys):
    """No subcommand accepts an abbreviation: one line, exit 2, naming the option meant where one is close."""
    from goldfish.app.cli import parse_command_line

    with pytest.raises(SystemExit) as exit_info:
        parse_command_line(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "unrecognized arguments: " + argv[-2] in err
    if meant:
        assert f"did you mean {meant}?" in err
    parser = build_parser()
    subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)][0].choices.values()
    assert not parser.allow_abbrev and not any(p.allow_abbrev for p in subcommands)


def test_mask_command_reports_drop_rate(capsys):
    text = (
        "The goldfish loss drops a pseudo-random subset of tokens from the next-token loss, so the model never "
        "sees the whole passage supervised and cannot repeat it verbatim. "
    ) * 3
    assert main(["mask", "--text", text, "--strategy", "hashed", "--k", "4", "--no-color"]) == 0
    out = capsys.readouterr().out
    assert "[[" in out and "targets dropped" in out
    assert main(["mask", "--text", text, "--strategy", "static", "--k", "3", "--no-color"]) == 0


def test_bad_input_gives_clear_errors(tmp_path, capsys):
    assert main(["mask", "--text", "hello world", "--k", "1"]) == 2
    assert "k" in capsys.readouterr().err
    missing = tmp_path / "missing.jsonl"
    assert main(["train", "--out", str(tmp_path / "run"), "--data", str(missing), "--no-progress"]) == 2
    assert "missing.jsonl" in capsys.readouterr().err
    assert main(["compare", "--masks", "hashed:x", "--out", str(tmp_path / "c")]) == 2
    assert "cannot parse mask" in capsys.readouterr().err


def test_train_then_eval_round_trip(tmp_path, capsys):
    records = [
        {"id": f"doc{i}", "text": " ".join(f"word{(i * 7 + j) % 53} token{j % 11}" for j in range(80))}
        for i in range(6)
    ]
    data_file = tmp_path / "docs.jsonl"
    data_file.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    run = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--out",
                str(run),
                *tiny_run(data=data_file, id_field="id", epochs=2, threads=None, strategy="static", k=3),
            ]
        )
        == 0
    )
    assert (run / "checkpoint" / "config.json").exists()
    assert (run / "checkpoint" / "goldfish_run.json").exists()
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 4  # 2 epochs x 2 steps
    out = tmp_path / "eval"
    assert (
        main(
            [
                "eval",
                "--model",
                str(run / "checkpoint"),
                "--out",
                str(out),
                "--suffix-len",
                "16",
                "--no-progress",
                "--beams",
                "2",
                "--samples",
                "2",
                "--prefix-lengths",
                "8,16",
            ]
        )
        == 0
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["train"]["n_docs"] == 4 and summary["heldout"]["n_docs"] == 2
    assert summary["train"]["beam"]["num_beams"] == 2 and summary["heldout"]["sampling"]["n_docs"] == 2
    assert summary["train"]["divergence"]["n_docs"] == 4 and "probabilistic" in summary["train"]
    # Membership: train vs held-out, with the run's initial weights as the reference model.
    assert set(summary["membership"]["attacks"]) == {
        "loss",
        "zlib",
        "min_k",
        "reference",
        "min_k_pp",
        "grad_norm",
        "recall",
        "dc_pdd",
    }
    recall = summary["membership"]["attacks"]["recall"]  # its prefix: the first held-out document, not scored
    assert recall["n_nonmembers"] == 1 and summary["membership"]["recall"]["prefix_documents"]
    assert all(lo <= m["auc"] <= hi for m in summary["membership"]["attacks"].values() for lo, hi in [m["auc_ci"]])
    assert len((out / "membership.jsonl").read_text().splitlines()) == 6
    assert (out / "report.md").exists()
    # The run's own static mask splits teacher-forced accuracy into kept and dropped positions.
    assert summary["train"]["tf_dropped_accuracy"] is not None
    rows = (out / "train" / "extraction.jsonl").read_text().splitlines()
    assert {json.loads(r)["id"] for r in rows} == {
        d["id"] for d in json.loads((run / "run.json").read_text())["documents"]["train"]
    }


def test_compare_quick_standard_memorizes_more_than_goldfish(tmp_path):
    out = tmp_path / "compare"
    # One thread: immune to oversubscription when other processes share the 2 cores.
    # Every instrument on: beam search, sampling, a prefix-length breakdown, repeats and the per-epoch curve.
    assert (
        main(
            [
                "compare",
                "--quick",
                "--out",
                str(out),
                "--no-progress",
                "--threads",
                "1",
                "--beams",
                "3",
                "--samples",
                "3",
                "--top-p",
                "0.9",
                "--prefix-lengths",
                "16,32",
                "--repeats",
                "1,2",
                "--curve-every",
                "25",
            ]
        )
        == 0
    )
    summary = json.loads((out / "summary.json").read_text())
    models = summary["models"]
    assert set(models) == {"control", "standard", "goldfish-hashed-k4-h13"}
    standard, goldfish, control = models["standard"], models["goldfish-hashed-k4-h13"], models["control"]
    for parts in models.values():
        for part in ("train", "heldout"):
            assert 0.0 <= parts[part]["exact_match"] <= 1.0 and 0.0 <= parts[part]["rouge_l"] <= 1.0
            assert parts[part]["n_docs"] > 0
    assert standard["train"]["rouge_l"] > goldfish["train"]["rouge_l"] + 0.2
    assert standard["train"]["exact_match"] > goldfish["train"]["exact_match"]
    assert control["train"]["exact_match"] == 0.0
    # The other instruments: membership inference per model, divergence analysis on the goldfish mask.
    assert set(summary["membership"]) == set(models)
    assert summary["membership"]["standard"]["attacks"]["loss"]["auc"] >= 0.5
    divergence = summary["details"]["goldfish-hashed-k4-h13"]["train"]["divergence"]
    assert divergence["n_diverged"] > 0 and divergence["share_on_dropped"] is not None
    assert (out / "report.md").exists() and (out / "compare.png").stat().st_size > 1000
    details = summary["details"]["standard"]["train"]
    assert (
        details["beam"]["num_beams"] == 3 and details["beam"]["exact_match"] >= standard["train"]["exact_match"] - 0.25
    )
    assert details["sampling"]["sampling"]["n_samples"] == 3 and details["sampling"]["sampling"]["top_p"] == 0.9
    assert [p["epoch"] for p in summary["curves"]["standard"]] == [0, 25, 50]
    assert summary["curves"]["standard"][-1]["exact_match"] == standard["train"]["exact_match"]
    assert [g["prefix_len"] for g in summary["breakdowns"]["prefix_length"]["standard"]] == [16, 32]
    by_repeats = {g["repeats"]: g for g in summary["breakdowns"]["repeats"]["standard"]}
    assert set(by_repeats) == {0, 1, 2} and by_repeats[0]["n_docs"] == models["standard"]["heldout"]["n_docs"]
    for name in ("extraction", "divergence", "probabilistic", "beam", "sampling", "prefix_length"):
        rows = (out / "standard" / "eval" / "train" / f"{name}.jsonl").read_text().splitlines()
        assert len(rows) == (2 if name == "prefix_length" else 1) * standard["train"]["n_docs"]
    membership_rows = (out / "standard" / "eval" / "membership.jsonl").read_text().splitlines()
    assert len(membership_rows) == standard["train"]["n_docs"] + standard["heldout"]["n_docs"]
    assert (out / "em_vs_epochs.png").exists() and (out / "divergence.png").exists()
    curve_rows = [json.loads(line) for line in (out / "standard" / "curve.jsonl").read_text().splitlines()]
    assert len(curve_rows) == 3 * standard["train"]["n_docs"]  # epochs 0, 25, 50
    last = [r["exact_match"] for r in curve_rows if r["epoch"] == 50]
    assert sum(last) / len(last) == summary["curves"]["standard"][-1]["exact_match"]
    assert "`curve.jsonl`" in (out / "report.md").read_text()
    # the per-target rows (targets.jsonl) give the paired statistics against standard that summary.json reports, by
    # scipy and statsmodels: standard extracts what goldfish does not, so McNemar and the differences are not trivial
    assert check_one_seed(out) == 2 * 3  # the control and goldfish against standard, buckets 0, 1 and 2
    goldfish_tests = summary["bucket_tests"]["models"]["goldfish-hashed-k4-h13"]
    assert sum(t["reference_only"] for t in goldfish_tests) > 0


def test_parallel_train_consolidates_into_a_checkpoint_that_eval_reads(tmp_path):
    """`goldfish train --nproc 2 --grid x=2` (torchrun, gloo) trains like one process and writes an HF checkpoint."""
    common = tiny_run(vocab_size=400, epochs=2, threads=None, strategy="hashed")
    parallel, serial = tmp_path / "parallel", tmp_path / "serial"
    result = subprocess.run(
        [sys.executable, "-m", "goldfish", "train", "--nproc", "2", "--grid", "x=2", "--out", str(parallel), *common],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert main(["train", "--out", str(serial), *common]) == 0
    losses = [
        [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]
        for run in (parallel, serial)
    ]
    # Same math, different reduction order across 2 ranks: agreement to float32 rounding (observed ~1e-7 relative).
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    record = json.loads((parallel / "checkpoint" / "goldfish_run.json").read_text())
    assert record["grid"] == {"data": 1, "x": 2, "y": 1, "z": 1}
    first_step = json.loads((parallel / "metrics.jsonl").read_text().splitlines()[0])
    assert first_step["bytes_sent"]["x"] > 0  # collectives of the x axis, counted per step
    out = tmp_path / "eval"
    instruments = ["--suffix-len", "16", "--no-progress", "--beams", "2", "--samples", "2", "--prefix-lengths", "8,16"]
    assert main(["eval", "--model", str(parallel / "checkpoint"), "--out", str(out), *instruments]) == 0
    assert json.loads((out / "summary.json").read_text())["train"]["n_docs"] == 4

    # `goldfish eval` on 2 ranks must give the single process's per-document results: data=2 shards the documents,
    # x=2 generates with the engine-parallel model (one shard).
    for grid in ("data=2", "x=2"):
        sharded = tmp_path / f"eval-{grid}"
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "goldfish",
                "eval",
                "--nproc",
                "2",
                "--grid",
                grid,
                "--model",
                str(parallel / "checkpoint"),
                "--out",
                str(sharded),
                *instruments,
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        for name in ("extraction", "beam", "sampling", "prefix_length", "probabilistic", "divergence"):
            for part in ("train", "heldout"):
                one, many = [
                    [json.loads(line) for line in (run / part / f"{name}.jsonl").read_text().splitlines()]
                    for run in (out, sharded)
                ]
                assert [r["id"] for r in one] == [r["id"] for r in many]
                for a, b in zip(one, many):
                    for key in ("generated_ids", "exact_match", "first_divergence", "samples", "n_exact"):
                        assert a.get(key) == b.get(key), (name, part, key)
                    if "log_q" in a:  # float sums in another order: float32 rounding (observed ~1e-7 relative)
                        assert a["log_q"] == pytest.approx(b["log_q"], rel=1e-4)
        one, many = [
            [json.loads(line) for line in (run / "membership.jsonl").read_text().splitlines()] for run in (out, sharded)
        ]
        assert [r["id"] for r in one] == [r["id"] for r in many]
        assert [r["loss"] for r in one] == pytest.approx([r["loss"] for r in many], rel=1e-4)
        assert json.loads((sharded / "summary.json").read_text())["grid"]["data" if grid == "data=2" else "x"] == 2


def test_parallel_compare_measures_the_curve_with_the_parallel_model(tmp_path):
    """`goldfish compare --nproc 2 --grid x=2`: the per-epoch extraction runs on the engine-parallel model being
    trained; its last point must equal the evaluation of the consolidated checkpoint (same weights)."""
    out = tmp_path / "compare"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "goldfish",
            "compare",
            "--nproc",
            "2",
            "--grid",
            "x=2",
            "--out",
            str(out),
            *tiny_run(vocab_size=400, epochs=4, threads=None, suffix_len=16, curve_every=2),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["grid"]["x"] == 2
    for label in ("standard", "goldfish-hashed-k4-h13"):
        curve = summary["curves"][label]
        assert [p["epoch"] for p in curve] == [0, 2, 4]
        final = summary["models"][label]["train"]
        assert curve[-1]["n_docs"] == final["n_docs"] == 4
        assert curve[-1]["exact_match"] == final["exact_match"]
        # RougeL of greedy text from the same weights, sharded vs consolidated: equal unless a logit tie flips.
        assert curve[-1]["rouge_l"] == pytest.approx(final["rouge_l"], abs=1e-6)


@pytest.mark.slow  # 20 s; every ZeRO stage equals one process in tests/parallel/test_zero.py
def test_zero3_train_equals_one_process_and_is_recorded(tmp_path):
    """`goldfish train --nproc 2 --grid data=2 --zero 3 --offload-optimizer` trains like one process (FSDP2 over data,
    AdamW state on the host) and the run record says which partitioning ran."""
    common = tiny_run(vocab_size=400, epochs=2, strategy="hashed")
    parallel, serial = tmp_path / "parallel", tmp_path / "serial"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "goldfish",
            "train",
            "--nproc",
            "2",
            "--grid",
            "data=2",
            "--zero",
            "3",
            "--zero-hierarchy",
            "2",
            "--offload-optimizer",
            "--out",
            str(parallel),
            *common,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert main(["train", "--out", str(serial), *common]) == 0
    losses = [
        [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]
        for run in (parallel, serial)
    ]
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    record = json.loads((parallel / "checkpoint" / "goldfish_run.json").read_text())
    assert (record["train"]["zero"], record["train"]["zero_node_size"], record["train"]["offload_optimizer"]) == (
        3,
        2,
        True,
    )


def test_zero_without_a_data_axis_is_a_one_line_error(tmp_path, capsys):
    settings = tiny_run(n_train=2, n_heldout=0, vocab_size=400, epochs=1, zero=2, threads=None)
    code = main(["train", "--out", str(tmp_path / "z"), *settings])
    err = capsys.readouterr().err
    assert code == 2 and "data" in err and "--zero" in err and "Traceback" not in err


@pytest.mark.slow  # 20 s; quantized ZeRO's numbers and bytes are tested in tests/parallel/test_zero_quantized.py
def test_zero_quantize_runs_are_recorded(tmp_path):
    """`goldfish train --nproc 2 --grid data=2 --zero 3 --zero-quantize weights,gradients` trains, records the setting
    and sends under 0.3x the data-axis bytes of the same run unquantized."""
    common = tiny_run(n_heldout=0, vocab_size=400, epochs=2, nproc=2, grid="data=2", zero=3)
    sent = {}
    for name, extra in (("exact", []), ("quantized", ["--zero-quantize", "weights,gradients"])):
        out = tmp_path / name
        result = subprocess.run(
            [sys.executable, "-m", "goldfish", "train", "--out", str(out), *common, *extra],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert all(math.isfinite(step["grad_norm"]) for step in steps)
        sent[name] = steps[0]["bytes_sent"]["data"]
        record = json.loads((out / "checkpoint" / "goldfish_run.json").read_text())
        assert record["train"]["zero_quantize"] == ("weights,gradients" if extra else "")
    assert sent["quantized"] <= 0.3 * sent["exact"], sent


def test_bad_zero_quantize_settings_are_one_line(tmp_path, capsys):
    """Bad ZeRO++ settings are one line, exit 2, before any worker starts."""
    bad = {
        ("--zero", "1", "--zero-quantize", "weights"): "stage 2 or 3",
        ("--zero", "3", "--zero-quantize", "weight"): "weights, gradients or weights,gradients",
        ("--zero", "3", "--zero-quantize", "gradients", "--zero-quantize-bits", "5"): "--zero-quantize-bits",
        ("--zero", "3", "--zero-quantize-block", "7"): "--zero-quantize-block",
        ("--zero", "3", "--zero-hierarchy", "3,4"): "smaller than the next and divide it",
    }
    for flags, message in bad.items():
        try:  # a flag's own parse error exits from argparse, a setting's check returns 2
            code = main(["train", "--out", str(tmp_path / "bad"), "--grid", "data=4", "--nproc", "4", *flags])
        except SystemExit as stop:
            code = stop.code
        err = capsys.readouterr().err
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "bad").exists()


@pytest.mark.slow  # 20 s; the shared layout equals one process in tests/parallel/test_shared_rows.py
def test_parallel_train_with_shared_rows_takes_a_batch_the_own_layout_refuses(tmp_path):
    """`goldfish train --nproc 4 --grid x=2,y=2 --rows shared --batch-size 2`: 2 rows cannot be split over 4 ranks
    (the own layout refuses with a one-line error naming --rows shared), but both x*y ranks can read the same 2 rows
    (AxoNN's layout): the losses are the single process's."""
    common = tiny_run(vocab_size=400, epochs=2, threads=None, strategy="hashed")
    launch = [sys.executable, "-m", "goldfish", "train", "--nproc", "4", "--grid", "x=2,y=2"]
    shared, own, serial = tmp_path / "shared", tmp_path / "own", tmp_path / "serial"
    result = subprocess.run(
        [*launch, "--rows", "shared", "--out", str(shared), *common], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    refused = subprocess.run([*launch, "--out", str(own), *common], capture_output=True, text=True, timeout=600)
    assert refused.returncode != 0
    assert "not divisible by the world size 4" in refused.stderr and "--rows shared" in refused.stderr
    assert main(["train", "--out", str(serial), *common]) == 0
    losses = [
        [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]
        for run in (shared, serial)
    ]
    assert len(losses[0]) == 4
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)  # float32 rounding across ranks (~1e-7 relative)
    record = json.loads((shared / "checkpoint" / "goldfish_run.json").read_text())
    assert record["grid"] == {"data": 1, "x": 2, "y": 2, "z": 1}


def test_zero_hierarchy_values_fill_the_node_and_its_inner_levels():
    """--zero-hierarchy 2,8 sets nodes of 8 with GCD pairs inside; a typed number or 'off' clears inner levels, and the
    untyped default (a resume's recorded node size) keeps the recorded ones."""
    from goldfish.app.config import hierarchy_fields, parse_node_size

    assert parse_node_size("2,8") == (2, 8) and parse_node_size("4") == (4,) and parse_node_size("off") == (1,)
    assert hierarchy_fields(parse_node_size("2,8"), (), None) == (8, (2,))
    assert hierarchy_fields(parse_node_size("4"), (2,), None) == (4, ())
    assert hierarchy_fields(8, (2,), None) == (8, (2,))  # not typed: the config's own value
    with pytest.raises(ValueError, match="level sizes such as 2,8"):
        parse_node_size("2,x")
    with pytest.raises(ValueError, match="needs a parallel run"):
        hierarchy_fields(parse_node_size("node"), (), None)
