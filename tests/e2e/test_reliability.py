"""What a careless or hostile user meets: a killed `--nproc` launcher, the launcher's sockets, the permissions of
outputs, argparse's errors, bad values that used to end in a traceback, silent skips of data files, background
caches, and `goldfish eval` into a used folder. Each case is refused in one line (exit 2) or handled as documented.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny_runs import tiny_run

from goldfish.app.cli import main

TINY = tiny_run(n_heldout=0, seq_len=32, vocab_size=300)

LONG = ["--epochs", "100000", "--dedup", "off"]
LINUX = sys.platform.startswith("linux")
_LOOPBACK = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}


def _children(pid: int) -> list[int]:
    """The pids whose parent is `pid` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    """True while `pid` runs (a zombie waiting for its new parent to reap it has ended)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _listening(pids: list[int]) -> list[str]:
    """The local addresses (hex, as /proc/net/tcp writes them) of the TCP sockets the processes listen on."""
    inodes = set()
    for pid in pids:
        for fd in (Path("/proc") / str(pid) / "fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    addresses = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                addresses.append(fields[1].split(":")[0])
    return addresses


def _start_long_run(out: Path) -> subprocess.Popen:
    """`goldfish train --nproc 2` for far longer than a test waits, in its own process group; returns once both
    workers have trained a step (metrics.jsonl has a line)."""
    launcher = subprocess.Popen(
        [sys.executable, "-m", "goldfish", "train", "--out", str(out), "--nproc", "2", *TINY, *LONG],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        # a pytest started in the background of a non-interactive shell ignores SIGINT, and a child inherits that:
        # give the launcher Ctrl-C's ordinary meaning whatever started the tests
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 300
    while not (out / "metrics.jsonl").exists() or not (out / "metrics.jsonl").read_text().strip():
        if launcher.poll() is not None:
            pytest.fail(f"the run ended early: {launcher.stderr.read().decode()[-3000:]}")
        if time.monotonic() > deadline:
            os.killpg(launcher.pid, signal.SIGKILL)
            pytest.fail("the workers did not train a step in 300 s")
        time.sleep(0.2)
    return launcher


def _assert_workers_die(workers: list[int], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    survivors = [pid for pid in workers if _alive(pid)]
    for pid in survivors:  # do not leave them training on a failed test
        os.kill(pid, signal.SIGKILL)
    assert not survivors, f"workers {survivors} outlived their launcher by {seconds} s"


@pytest.mark.skipif(not LINUX, reason="reads /proc")
def test_a_launcher_killed_with_sigkill_takes_its_workers_and_listens_on_loopback_only(tmp_path):
    launcher = _start_long_run(tmp_path / "run")
    workers = _children(launcher.pid)
    assert len(workers) == 2, workers
    # the store the workers meet in, and every socket the workers listen on, are reachable from this machine only
    addresses = _listening([launcher.pid])
    assert addresses and set(addresses) <= _LOOPBACK, addresses
    assert set(_listening(workers)) <= _LOOPBACK, _listening(workers)
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait()
    _assert_workers_die(workers)
    # the killed launcher's folder of run file and error lines is removed by the next launch
    from goldfish.app.launch import WORKER_FOLDER_PREFIX, remove_orphaned_worker_folders

    left = [p.name for p in remove_orphaned_worker_folders()]
    assert any(name.startswith(f"{WORKER_FOLDER_PREFIX}{launcher.pid}-") for name in left), left


@pytest.mark.skipif(not LINUX, reason="reads /proc")
def test_a_launcher_whose_process_group_is_killed_takes_its_workers(tmp_path):
    launcher = _start_long_run(tmp_path / "run")
    workers = _children(launcher.pid)
    assert len(workers) == 2, workers
    os.killpg(launcher.pid, signal.SIGKILL)  # what a scheduler or a terminal does to a job
    launcher.wait()
    _assert_workers_die(workers)


@pytest.mark.skipif(not LINUX, reason="reads /proc")
def test_ctrl_c_on_the_launcher_stops_its_workers_after_a_step_they_checkpoint_with_one_line(tmp_path):
    out = tmp_path / "run"
    launcher = _start_long_run(out)
    workers = _children(launcher.pid)
    os.kill(launcher.pid, signal.SIGINT)  # what Ctrl-C sends to the terminal's foreground job
    assert launcher.wait(timeout=60) == 130
    err = launcher.stderr.read().decode().strip().splitlines()
    step = json.loads((out / "checkpoint" / "goldfish_run.json").read_text())["step"]  # forwarded: all stopped there
    checkpoint = out / "checkpoint"
    assert err[-1] == (
        f"goldfish train: interrupted after step {step} (its checkpoint: {checkpoint}). Continue with: goldfish "
        f"train --resume {checkpoint} --threads 1 --no-progress --nproc 2"
    ), err[-3:]
    assert "Traceback" not in "\n".join(err)
    _assert_workers_die(workers, seconds=1.0)  # reaped by the launcher before it exited


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["train", "--out", "o", "--repeats", "1,x"], "goldfish train: error: --repeats: cannot parse repeats '1,x'"),
        (["train", "--out", "o", "--k", "x"], "goldfish train: error: --k: expected an integer, got 'x'"),
        (["train", "--out", "o", "--lr", "fast"], "goldfish train: error: --lr: expected a number, got 'fast'"),
        (["eval", "--model", "m", "--out", "o", "--prefix-lengths", "1,a"], "goldfish eval: error: --prefix-lengths:"),
        (["train", "--out", "o", "--threads", "-1"], "goldfish train: error: --threads: must be >= 1, got -1"),
        (["compare", "--nproc", "0"], "goldfish compare: error: --nproc: must be >= 1, got 0"),
        (["train", "--out", "o", "--strategy", "nope"], "goldfish train: error: --strategy: invalid choice: 'nope'"),
        (["eval", "--out", "o"], "goldfish eval: error: the following arguments are required: --model"),
        (["plan", "--gpus", "x"], "goldfish plan: error: --gpus: expected an integer, got 'x'"),
    ],
)
def test_argparse_errors_are_one_line_naming_the_option_without_python_names(argv, expected, capsys):
    with pytest.raises(SystemExit) as exit:
        main(argv)
    assert exit.value.code == 2
    err = _one_line(capsys)
    assert err.startswith(expected), err
    assert err.endswith(f"(see goldfish {argv[0]} --help)"), err
    assert "usage:" not in err and "parse_" not in err and "<lambda>" not in err, err


def test_outputs_take_the_users_umask(tmp_path):
    """Every file of a run, the atomically written ones (run.json, checkpoint files) included, is 0666 less the
    umask: 0640 under umask 027, not mkstemp's 0600."""
    old = os.umask(0o027)
    try:
        assert main(["train", "--out", str(tmp_path / "run"), *TINY, "--epochs", "1", "--dedup", "off"]) == 0
    finally:
        os.umask(old)
    modes = {str(p.relative_to(tmp_path)): p.stat().st_mode & 0o777 for p in tmp_path.rglob("*") if p.is_file()}
    assert "run/run.json" in modes and "run/checkpoint/model.safetensors" in modes, sorted(modes)
    assert set(modes.values()) == {0o640}, {name: oct(mode) for name, mode in modes.items()}


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["train", "--out", "o", "--device", "foo"], "goldfish train: error: --device: unknown device 'foo'"),
        (["eval", "--model", "m", "--out", "o", "--device", "meta"], "goldfish eval: error: --device: goldfish cannot"),
        pytest.param(
            ["train", "--out", "o", "--device", "cuda"],
            "goldfish train: error: --device: cuda is not available on this machine",
            marks=pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a GPU is there"),
        ),
    ],
)
def test_a_device_this_machine_lacks_is_one_line(argv, expected, capsys):
    with pytest.raises(SystemExit) as exit:
        main(argv)
    assert exit.value.code == 2
    assert _one_line(capsys).startswith(expected)


# ----- goldfish eval: its --out, its protocol against the documents, a model whose config does not fit -----------

EVAL = ["--suffix-len", "8", "--no-progress", "--threads", "1", "--bootstrap", "0"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("reliability") / "run"
    assert main(["train", "--out", str(out), *TINY, "--n-heldout", "2", "--epochs", "1", "--dedup", "off"]) == 0
    return out


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_eval_into_a_non_empty_out_is_refused_before_any_work(run, capsys):
    before = _files(run)
    assert main(["eval", "--model", str(run / "checkpoint"), "--out", str(run), *EVAL]) == 2
    err = _one_line(capsys)
    assert f"--out {run} is not empty" in err and "--overwrite" in err, err
    assert _files(run) == before  # nothing written into the training run's folder


def test_eval_overwrite_clears_an_earlier_evals_files_and_keeps_the_rest(run, tmp_path, capsys):
    out, fresh = tmp_path / "eval", tmp_path / "fresh"
    model = ["--model", str(run / "checkpoint")]
    assert main(["eval", *model, "--out", str(out), *EVAL, "--beams", "2"]) == 0
    assert (out / "train" / "beam.jsonl").exists()
    (out / "notes.txt").write_text("the user's own file")
    assert main(["eval", *model, "--out", str(out), *EVAL]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert main(["eval", *model, "--out", str(out), *EVAL, "--overwrite"]) == 0
    assert not (out / "train" / "beam.jsonl").exists()  # no stale file of the earlier eval
    assert (out / "notes.txt").read_text() == "the user's own file"
    assert main(["eval", *model, "--out", str(fresh), *EVAL]) == 0
    assert set(_files(out)) - {"notes.txt"} == set(_files(fresh))


@pytest.mark.parametrize(
    "protocol, expected",
    [
        (["--suffix-len", "100"], "--suffix-len 100 needs documents of at least 101 tokens"),
        (
            ["--prefix-len", "30", "--suffix-len", "8"],
            "--prefix-len 30 with --suffix-len 8 needs documents",
        ),
    ],
)
def test_an_extraction_protocol_longer_than_the_documents_is_refused_before_any_output(
    run, tmp_path, capsys, protocol, expected
):
    out = tmp_path / "eval"
    argv = ["eval", "--model", str(run / "checkpoint"), "--out", str(out), *EVAL, *protocol]
    assert main(argv) == 2
    err = _one_line(capsys)
    assert expected in err and "have at most 32" in err, err
    assert not out.exists()


def test_eval_out_that_is_a_file_or_cannot_be_written(run, tmp_path, capsys):
    model = ["--model", str(run / "checkpoint")]
    assert main(["eval", *model, "--out", str(run / "run.json"), *EVAL]) == 2
    assert "is a file, not a folder" in _one_line(capsys)
    assert main(["eval", *model, "--out", str(run / "run.json" / "eval"), *EVAL]) == 2
    assert f"({run / 'run.json'} is a file)" in _one_line(capsys)
    if LINUX:  # nothing can be created in /proc, even by root
        assert main(["eval", *model, "--out", "/proc/goldfish-eval", *EVAL]) == 2
        assert "cannot write in /proc" in _one_line(capsys)


@pytest.mark.parametrize("where", ["under a file", "in /proc"])
def test_train_out_that_cannot_be_written_is_one_line(tmp_path, capsys, where):
    if where == "in /proc" and not LINUX:
        pytest.skip("Linux's /proc")
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = blocker / "run" if where == "under a file" else Path("/proc/goldfish-run")
    assert main(["train", "--out", str(out), *TINY, "--epochs", "1", "--dedup", "off"]) == 2
    err = _one_line(capsys)
    assert err.startswith("goldfish train: error: --out ") and "Fix:" in err, err


@pytest.mark.parametrize("change", ["other shapes", "a layer more"])
def test_a_model_whose_config_does_not_match_its_weights_is_refused(run, tmp_path, capsys, change):
    folder = tmp_path / "model"
    folder.mkdir()
    for path in (run / "checkpoint").iterdir():
        if path.is_file():
            (folder / path.name).write_bytes(path.read_bytes())
    config = json.loads((folder / "config.json").read_text())
    if change == "other shapes":
        config["intermediate_size"] *= 2
    else:
        config["num_hidden_layers"] += 1  # transformers would fill the missing layer with random weights
    (folder / "config.json").write_text(json.dumps(config))
    assert main(["eval", "--model", str(folder), "--out", str(tmp_path / "eval"), *EVAL]) == 2
    err = _one_line(capsys)
    assert err.startswith(f"goldfish eval: error: cannot load model '{folder}'"), err
    assert ("does not match its weights" if change == "other shapes" else "which would be random") in err
    assert not (tmp_path / "eval" / "summary.json").exists()


# ----- data: a single huge document, silent skips, background caches --------------------------------------------


def test_a_huge_single_document_is_refused_before_any_tokenizing(tmp_path, capsys):
    """One 8 MB line: the count of documents says at once that 4 + 2 cannot be selected; before, the tokenizer was
    trained on it and it was tokenized first (minutes and gigabytes for 50 MB)."""
    big = tmp_path / "one.txt"
    big.write_text(" ".join(f"word{i % 5000}" for i in range(1_000_000)))
    started = time.monotonic()
    argv = ["train", "--out", str(tmp_path / "run"), *TINY, "--n-heldout", "2", "--data", str(big)]
    assert main(argv) == 2
    err = _one_line(capsys)
    assert "not enough documents: the source holds 1, but n_train + n_heldout = 4 + 2 = 6 are needed" in err, err
    assert time.monotonic() - started < 60


def test_a_data_folder_with_other_files_or_broken_links_is_refused_naming_them(tmp_path, capsys):
    folder = tmp_path / "docs"
    folder.mkdir()
    for i in range(8):
        (folder / f"{i}.txt").write_text(f"document {i} " * 40)
    (folder / "notes.md").write_text("not a .txt file")
    argv = ["train", "--out", str(tmp_path / "run"), *TINY, "--data", str(folder)]
    assert main(argv) == 2
    err = _one_line(capsys)
    assert "1 file(s) that are not .txt (notes.md) would be left out" in err, err
    (folder / "notes.md").unlink()
    (folder / "gone.txt").symlink_to(tmp_path / "missing.txt")
    assert main(argv) == 2
    err = _one_line(capsys)
    assert "1 broken link(s), e.g. gone.txt" in err, err


def _tokenizer():
    import data

    return data.train_bpe_tokenizer([f"word{i} text{i % 7}" for i in range(300)], vocab_size=300)


def test_background_with_invalid_utf8_is_refused_with_file_and_byte_as_data_is(tmp_path):
    import data
    from data.corpus import tokenize_corpus

    folder = tmp_path / "bg"
    folder.mkdir()
    (folder / "a.txt").write_text("fine text " * 10)
    (folder / "b.txt").write_bytes(b"good start \xff\xfe then bad")
    with pytest.raises(data.DataError, match=r"b\.txt, whole file: not valid UTF-8 \(byte 11"):
        tokenize_corpus(str(folder), _tokenizer(), cache_dir=tmp_path / "cache", progress=False)
    with pytest.raises(data.DataError, match=r"b\.txt, whole file: not valid UTF-8 \(byte 11"):
        data.load_documents(folder)


def _ids(corpus) -> list[list[int]]:
    return [corpus.ids(i) for i in range(len(corpus))]


def test_background_cache_is_keyed_by_content_and_checked_before_use(tmp_path):
    from data.corpus import tokenize_corpus

    tokenizer = _tokenizer()
    folder, cache = tmp_path / "bg", tmp_path / "cache"
    folder.mkdir()
    (folder / "a.txt").write_text("word1 word2 word3 " * 20)
    (folder / "b.txt").write_text("text1 text2 text3 " * 20)
    first = tokenize_corpus(str(folder), tokenizer, cache_dir=cache, progress=False)
    first_text = {name: (folder / name).read_bytes() for name in ("a.txt", "b.txt")}
    assert tokenize_corpus(str(folder), tokenizer, cache_dir=cache, progress=False).fingerprint() == first.fingerprint()

    # a rewritten file (same name, same size, same modification time) is tokenized again, not read from the cache
    stat = (folder / "b.txt").stat()
    (folder / "b.txt").write_text("text4 text5 text6 " * 20)
    os.utime(folder / "b.txt", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    rewritten = tokenize_corpus(str(folder), tokenizer, cache_dir=cache, progress=False)
    assert rewritten.fingerprint() != first.fingerprint()
    truth = tokenizer("text4 text5 text6 " * 20, add_special_tokens=False)["input_ids"]
    assert rewritten.ids(1)[-len(truth) :] == truth
    expected = _ids(rewritten)  # read now: the corpus maps its file, which is tampered with below

    # an entry that does not hold what its manifest says (tampered, or planted under this key) is not used
    entry = cache / "tokenized" / rewritten.fingerprint()
    (entry / "tokens.arrow").write_bytes((cache / "tokenized" / first.fingerprint() / "tokens.arrow").read_bytes())
    again = tokenize_corpus(str(folder), tokenizer, cache_dir=cache, progress=False)
    assert _ids(again) == expected

    # the cached text of the files is checked against the files too: a planted one is read again from the files
    from data.corpus import files_digest, text_source_files

    def rows_file(digest: str) -> Path:  # the cached text of the files whose content has this digest
        (found,) = (cache / "generator").glob(f"*{digest}/**/*.arrow")
        return found

    now = files_digest(text_source_files(str(folder)))
    for name, content in first_text.items():  # the digest of the first version, to find its cached text
        (tmp_path / "first").mkdir(exist_ok=True)
        (tmp_path / "first" / name).write_bytes(content)
    before = files_digest(text_source_files(str(tmp_path / "first")))
    rows_file(now).write_bytes(rows_file(before).read_bytes())
    shutil.rmtree(entry)  # so the tokens are made from the cached text again
    rebuilt = tokenize_corpus(str(folder), tokenizer, cache_dir=cache, progress=False)
    assert _ids(rebuilt) == expected


def test_a_single_document_background_names_the_real_cause(tmp_path):
    import data
    from data.background import build_background
    from data.corpus import tokenize_corpus
    from engine.training.train import TrainConfig
    from goldfish.app.config import DataSpec, MaskSpec
    from goldfish.app.data_settings import background_spec, row_mask

    tokenizer = _tokenizer()
    background = tmp_path / "bg.txt"
    background.write_text(" ".join(f"word{i % 50}" for i in range(20_000)))
    corpus = tokenize_corpus(str(background), tokenizer, cache_dir=tmp_path / "cache", progress=False)
    targets = [data.Document(id=f"t{i}", text=f"text{i} " * 40, source="t") for i in range(4)]
    split = data.select_documents(targets, tokenizer, n_train=2, n_heldout=2, seq_len=16, whole_documents=32)
    spec = DataSpec(source="x", background=str(background), seq_len=32, val_tokens=16384)
    train = TrainConfig(epochs=1, batch_size=4, shuffle=False, progress=False)
    special = sorted(set(tokenizer.all_special_ids))
    with pytest.raises(data.DataError, match="is a single document") as refused:
        build_background(
            background_spec(spec),
            corpus,
            split.train,
            split.heldout,
            tokenizer,
            row_mask(MaskSpec(None), special),
            train,
            tokenizer.pad_token_id,
        )
    assert "raise --val-tokens" not in str(refused.value)


def test_streamed_background_cache_is_keyed_by_content_and_checked_before_use(tmp_path):
    from data.corpus import stream_corpus

    tokenizer = _tokenizer()
    folder, cache = tmp_path / "bg", tmp_path / "cache"
    folder.mkdir()
    for name, words in (("a.txt", "word1 word2 "), ("b.txt", "text1 text2 ")):
        (folder / name).write_text(words * 30)

    def stream():
        return stream_corpus(str(folder), tokenizer, 10_000, cache_dir=cache, progress=False)

    first = stream()
    expected = _ids(first)
    (manifest,) = (cache / "streamed").glob("*.json")
    nonce = json.loads(manifest.read_text())["nonce"]
    again = stream()
    assert again.fingerprint() == first.fingerprint() and json.loads(manifest.read_text())["nonce"] == nonce

    # a tampered entry is not used: the stream is read again into an entry of another name
    (arrow,) = json.loads(manifest.read_text())["files"]
    Path(arrow["name"]).write_bytes(Path(arrow["name"]).read_bytes()[:-64] + bytes(64))
    checked = stream()
    assert _ids(checked) == expected and json.loads(manifest.read_text())["nonce"] != nonce

    # a rewritten file is streamed again
    (folder / "b.txt").write_text("text4 text5 " * 30)
    rewritten = stream()
    assert rewritten.fingerprint() != first.fingerprint()
    assert rewritten.ids(1)[1:] == tokenizer("text4 text5 " * 30, add_special_tokens=False)["input_ids"]


def test_a_jsonl_background_rewritten_with_its_old_size_and_time_is_read_again(tmp_path):
    """datasets keys its cache of a local file by path and modification time: the rows are keyed by content."""
    from data.corpus import tokenize_corpus

    tokenizer = _tokenizer()
    path, cache = tmp_path / "bg.jsonl", tmp_path / "cache"
    path.write_text(json.dumps({"text": "word1 word2 " * 20}) + "\n")
    stat = path.stat()
    first = tokenize_corpus(str(path), tokenizer, cache_dir=cache, progress=False)
    path.write_text(json.dumps({"text": "text1 text2 " * 20}) + "\n")  # the same size
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    again = tokenize_corpus(str(path), tokenizer, cache_dir=cache, progress=False)
    assert again.fingerprint() != first.fingerprint()
    assert again.ids(0)[1:] == tokenizer("text1 text2 " * 20, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["train", "--out", "o", "--epochs", "999999999999"], "--epochs: must be at most 1,000,000, got 999,999,"),
        (["train", "--out", "o", "--max-steps", "10000000000"], "--max-steps: must be at most 1,000,000,000"),
        (["train", "--out", "o", "--seq-len", "100000000"], "--seq-len: must be at most 1,048,576"),
        (["train", "--out", "o", "--seed", str(2**64)], "--seed: must be at most 9,223,372,036,854,775,807"),
        (["eval", "--model", "m", "--out", "o", "--beams", "1000000"], "--beams: must be at most 128, got 1,000,000"),
        (["eval", "--model", "m", "--out", "o", "--samples", "10000000"], "--samples: must be at most 10,000"),
        (
            ["compare", "--out", "o", "--n-train", "1" + "0" * 5000],
            "--n-train: must be at most 10,000,000, got a number of 5,001",
        ),
        (["compare", "--nproc", "100000"], "--nproc: must be at most 1,024"),
    ],
)
def test_every_count_has_a_bound_checked_as_it_is_parsed(argv, expected, capsys):
    with pytest.raises(SystemExit) as exit:
        main(argv)
    assert exit.value.code == 2
    assert expected in _one_line(capsys)


def test_a_million_epochs_start_training_at_once(tmp_path):
    """The largest --epochs trains its first steps as quickly as one epoch does: nothing is laid out per epoch."""
    out = tmp_path / "run"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "goldfish", "train", "--out", str(out), *TINY, "--epochs", "1000000", "--dedup", "off"],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while not (out / "metrics.jsonl").exists() or not (out / "metrics.jsonl").read_text().strip():
            assert launcher.poll() is None, launcher.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "no step trained within 60 s"
            time.sleep(0.2)
    finally:
        launcher.kill()
        launcher.wait()


@pytest.mark.parametrize(
    "target, expected",
    [
        ("/dev/zero", "--file /dev/zero: holds more than 1,000,000 bytes"),  # read up to the bound, never whole
        (".", "is a folder; give one text file"),
        ("binary", "byte 0 is not UTF-8; give a UTF-8 text file"),
        ("missing.txt", "cannot read it (No such file or directory)"),
    ],
)
def test_mask_file_is_read_bounded_and_refused_in_one_line(target, expected, tmp_path, capsys):
    if target == "/dev/zero" and not Path(target).exists():
        pytest.skip("no /dev/zero here")
    (tmp_path / "binary").write_bytes(b"\xff\xfe\x00abc")
    path = target if target.startswith("/") else str(tmp_path / target)
    assert main(["mask", "--file", path, "--no-color"]) == 2
    assert expected in _one_line(capsys)


def test_mask_shows_characters_split_over_byte_tokens_as_themselves(capsys):
    text = "Le café coûte 3 €, 水 est l'eau; ΟΔΟΣ"
    assert main(["mask", "--text", text, "--no-color", "--k", "2"]) == 0
    shown = capsys.readouterr().out.splitlines()[0]
    assert "\ufffd" not in shown
    assert shown.replace("[[", "").replace("]]", "") == text


def test_eval_takes_the_out_lock_so_a_second_writer_is_refused(tmp_path, capsys):
    """Two evals into one new --out, or an eval --overwrite into the folder of a running train: the second one
    finds the folder's lock held and stops in one line before writing anything."""
    from goldfish.app.runlock import out_lock

    for out, extra in ((tmp_path / "new", []), (tmp_path / "training", ["--overwrite"])):
        with out_lock(out):  # what a running train or eval holds for its whole life
            if extra:
                (out / "metrics.jsonl").write_text('{"step": 1}\n')
            argv = ["eval", "--model", str(tmp_path / "model"), "--out", str(out), "--no-progress", *extra]
            assert main(argv) == 2
            assert "is in use by another goldfish run" in _one_line(capsys)
            # nothing of the refused eval is there: the training's file untouched, nothing added
            assert sorted(p.name for p in out.iterdir()) == [".goldfish.lock", *(["metrics.jsonl"] if extra else [])]


_CONFIG = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"hidden_size": -4}, "hidden_size is -4, outside 1 to 131,072"),
        ({"hidden_size": 0}, "hidden_size is 0, outside 1 to 131,072"),
        ({"hidden_size": 10**20}, "hidden_size is 100000000000000000000, outside 1 to 131,072"),
        ({"hidden_size": 3.5}, "hidden_size is 3.5, not an integer"),
        ({"hidden_size": "big"}, 'hidden_size is "big", not an integer'),
        ({"num_hidden_layers": 1e9}, "num_hidden_layers is 1000000000.0, not an integer"),
        ({"num_attention_heads": 0}, "num_attention_heads is 0, outside 1 to 4,096"),
        ({"num_attention_heads": 5}, "hidden size 64 is not divisible by its 5 attention heads"),
        ({"num_key_value_heads": 3}, "4 attention heads are not divisible by its 3 key/value heads"),
        ("nested", "its JSON is nested too deeply to be a model config"),
        ("list", "holds a JSON list, not an object of model settings"),
    ],
)
def test_a_hostile_config_json_is_one_line_from_plan_train_eval_and_compare(change, expected, tmp_path, capsys):
    folder = tmp_path / "model"
    folder.mkdir()
    if change == "nested":
        text = "[" * 100_000 + "]" * 100_000
    elif change == "list":
        text = "[1, 2]"
    else:
        text = json.dumps(_CONFIG | change)
    (folder / "config.json").write_text(text)
    commands = [
        ["plan", "--model", str(folder), "--gpus", "8"],
        ["train", "--model", str(folder), "--out", str(tmp_path / "t"), *TINY[2:]],
        ["train", "--model", str(folder), "--out", str(tmp_path / "p"), "--nproc", "2", "--grid", "pipe=2", *TINY[2:]],
        ["compare", "--model", str(folder), "--out", str(tmp_path / "c"), *TINY[2:]],
        ["eval", "--model", str(folder), "--out", str(tmp_path / "e"), "--data", "default", "--no-progress"],
    ]
    for argv in commands:
        code = main(argv)
        assert code == 2, argv
        line = _one_line(capsys)
        assert line.startswith(f"goldfish {argv[0]}: error: {folder / 'config.json'}: ") and expected in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # nothing written


@pytest.mark.parametrize("flags", [["--k", "8"], ["--h", "0"], ["--k", "1", "--h", "3"]])
def test_eval_refuses_mask_options_without_a_strategy(flags, tmp_path, capsys):
    argv = ["eval", "--model", "micro-llama", "--out", str(tmp_path / "e"), "--data", "default", *flags]
    assert main(argv) == 2
    line = _one_line(capsys)
    assert "set the mask of --strategy" in line and "Fix: add --strategy" in line, line
    assert not (tmp_path / "e").exists()


class _Planted:
    """A pickled object that would write a file when unpickled: weights-only loading must refuse it unrun."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("weights", ["pickled", "truncated"])
def test_reference_weights_that_would_be_refused_are_refused_before_any_output(weights, tmp_path, capsys):
    import torch
    from transformers import LlamaConfig

    reference = tmp_path / "reference"
    LlamaConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, vocab_size=300).save_pretrained(reference)
    marker = tmp_path / "unpickled"
    if weights == "pickled":
        torch.save({"w": _Planted(str(marker))}, reference / "pytorch_model.bin")
        expected = "holds objects other than tensors"
    else:
        (reference / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
        expected = "model.safetensors"
    out = tmp_path / "eval"
    argv = ["eval", "--model", "micro-llama", "--data", "default", "--n-train", "4", "--n-heldout", "2"]
    assert main([*argv, "--reference", str(reference), "--out", str(out), "--no-progress", "--threads", "1"]) == 2
    line = _one_line(capsys)
    assert line.startswith(f"goldfish eval: error: --reference {reference}: ") and expected in line, line
    assert not out.exists() and not marker.exists()


def _five_documents(tmp_path: Path) -> Path:
    from data.corpus import default_corpus

    path = tmp_path / "six.jsonl"
    texts = [d.text for d in default_corpus()][:6]
    path.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    return path


@pytest.mark.slow
def test_a_settings_error_the_workers_find_leaves_the_folder_empty_for_the_corrected_command(tmp_path, capsys):
    """5 training rows in one short step of 5 cannot split into 2 micro-batches: the pipe workers find it after the
    launcher wrote run.json; the run's files are removed, so the corrected command is not refused as 'not empty'."""
    documents = _five_documents(tmp_path)
    out = tmp_path / "run"
    argv = [
        "train",
        "--out",
        str(out),
        "--data",
        str(documents),
        *tiny_run(n_train=5, n_heldout=1, seq_len=32, batch_size=8),
    ]
    argv += ["--vocab-size", "300", "--nproc", "2", "--grid", "pipe=2", "--epochs", "1"]
    assert main([*argv, "--microbatches", "2"]) == 2
    assert "do not split into --microbatches 2" in capsys.readouterr().err
    assert not out.exists() or sorted(p.name for p in out.iterdir()) == []
    assert main([*argv, "--n-train", "4", "--microbatches", "2"]) == 0  # the corrected command
    assert (out / "checkpoint").is_dir()


def test_a_settings_error_after_the_checks_removes_what_the_new_run_wrote(tmp_path, monkeypatch, capsys):
    """One process: a ValueError the run raises after writing run.json (stood in by the data step) leaves nothing
    behind; the refusal of a non-empty folder names --resume only when there is a checkpoint to resume."""
    import goldfish.app.prepare as prepare

    def refuse(*args, **kwargs):
        raise ValueError("a setting the run found late")

    out = tmp_path / "run"
    monkeypatch.setattr(prepare, "prepare_data", refuse)
    assert main(["train", "--out", str(out), *TINY, "--epochs", "1"]) == 2
    assert "a setting the run found late" in _one_line(capsys)
    assert not out.exists()
    out.mkdir()
    (out / "run.json").write_text("{}")
    monkeypatch.undo()
    assert main(["train", "--out", str(out), *TINY, "--epochs", "1"]) == 2
    line = _one_line(capsys)
    assert "is not empty (it holds run.json)" in line and "--resume" not in line, line
    assert (out / "run.json").read_text() == "{}"  # an earlier run's file is never removed


@pytest.mark.parametrize(
    "line, expected",
    [
        ('{"id": "a", "text": ' + "[" * 100_000 + "]" * 100_000 + "}", "line 2: JSON nested too deeply to read"),
        (
            '{"id": "a", "text": "abc \\ud800 def"}',
            "line 2: field 'text' holds a lone surrogate (U+D800 at character 4)",
        ),
        ('{"id": "\\udfff", "text": "abc def"}', "line 2: its id holds a lone surrogate (U+DFFF at character 0)"),
        ('{"id": ' + "9" * 5000 + ', "text": "abc"}', "line 2: unreadable JSON (a number of more than 4,300 digits)"),
    ],
)
def test_hostile_json_in_data_is_one_line_naming_file_and_line(line, expected, tmp_path, capsys):
    path = tmp_path / "docs.jsonl"
    path.write_text('{"id": "ok", "text": "a fine document"}\n' + line + "\n")
    assert main(["train", "--out", str(tmp_path / "run"), "--data", str(path), "--id-field", "id", *TINY]) == 2
    error = _one_line(capsys)
    assert error.startswith(f"goldfish train: error: {path}, ") and expected in error, error


def test_overwrite_of_a_symlinked_out_replaces_the_target_and_keeps_the_link(tmp_path):
    disk = tmp_path / "other-disk"
    disk.mkdir()
    (disk / "run").mkdir()
    (disk / "run" / "old.txt").write_text("the earlier run")
    link = tmp_path / "run"
    link.symlink_to(disk / "run")
    assert main(["train", "--out", str(link), *TINY, "--epochs", "1", "--dedup", "off", "--overwrite"]) == 0
    assert link.is_symlink() and os.readlink(link) == str(disk / "run")
    assert (disk / "run" / "checkpoint" / "model.safetensors").exists() and not (disk / "run" / "old.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other-disk", "run"]  # no .run.old-PID, no staging left
    assert sorted(p.name for p in disk.iterdir()) == ["run"]


def test_prefix_lengths_no_document_is_long_enough_for_are_refused_before_any_output(tmp_path, capsys):
    argv = ["compare", "--out", str(tmp_path / "c"), *TINY, "--prefix-lengths", "8,40", "--suffix-len", "8"]
    assert main(argv) == 2
    line = _one_line(capsys)
    assert "--prefix-lengths 40: with --suffix-len 8 a document needs 48 tokens" in line, line
    assert not (tmp_path / "c").exists()
    argv = ["eval", "--model", "micro-llama", "--data", "default", "--n-train", "4", "--n-heldout", "2"]
    argv += ["--seq-len", "32", "--out", str(tmp_path / "e"), "--suffix-len", "8", "--prefix-lengths", "30"]
    # a vocabulary its few documents can fill: the default 2048 would add the smaller-vocabulary warning line
    assert main([*argv, "--vocab-size", "512", "--no-progress", "--threads", "1"]) == 2
    line = _one_line(capsys)
    assert "--prefix-lengths 30: with --suffix-len 8 a document needs 38 tokens" in line, line
    assert "the evaluated documents have at most 32" in line and not (tmp_path / "e").exists()


def test_worker_folders_of_dead_launchers_are_removed_and_live_ones_kept(tmp_path):
    from goldfish.app.launch import WORKER_FOLDER_PREFIX, remove_orphaned_worker_folders

    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    dead = tmp_path / f"{WORKER_FOLDER_PREFIX}{ended.pid}-abc"
    alive = tmp_path / f"{WORKER_FOLDER_PREFIX}{os.getpid()}-xyz"
    other = tmp_path / "goldfish-workers-notapid"
    for folder in (dead, alive, other):
        folder.mkdir()
        (folder / "run.json").write_text("{}")
    assert remove_orphaned_worker_folders(tmp_path) == [dead]
    assert not dead.exists() and alive.exists() and other.exists()
