"""Tests for data/: loaders, bad input messages, default corpus, tokenizer, seeded selection."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data import (
    DEFAULT_CORPUS,
    DataError,
    DedupConfig,
    Document,
    default_corpus,
    load_documents,
    load_tokenizer,
    select_documents,
    train_bpe_tokenizer,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def corpus() -> list[Document]:
    return default_corpus()


@pytest.fixture(scope="module")
def tokenizer(corpus):
    return train_bpe_tokenizer([doc.text for doc in corpus], vocab_size=1024)


@pytest.fixture(scope="module")
def text_ids(corpus, tokenizer) -> dict[str, list[int]]:
    """Each corpus document's full tokenization, no special tokens (the reference for truncation)."""
    encoded = tokenizer([doc.text for doc in corpus], add_special_tokens=False)["input_ids"]
    return {doc.id: ids for doc, ids in zip(corpus, encoded)}


# ---------------------------------------------------------------- loaders


def test_jsonl_custom_text_and_id_fields(tmp_path):
    path = write_jsonl(
        tmp_path / "docs.jsonl",
        [
            {"body": "first text", "key": "a", "other": 1},
            {"body": "second text", "key": 7},  # integer ids become strings
        ],
    )
    docs = load_documents(path, text_field="body", id_field="key")
    assert docs == [Document("a", "first text", str(path)), Document("7", "second text", str(path))]


def test_jsonl_default_ids_are_file_and_line_and_blank_lines_are_skipped(tmp_path):
    path = tmp_path / "docs.jsonl"
    # A byte-order mark and a blank line in the middle are tolerated; ids keep the real line numbers.
    path.write_text('\ufeff{"text": "one"}\n\n{"text": "three"}\n', encoding="utf-8")
    docs = load_documents(str(path))
    assert [(d.id, d.text) for d in docs] == [("docs.jsonl:1", "one"), ("docs.jsonl:3", "three")]


def test_txt_file_is_one_document(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text("Line one.\nLine two.\n", encoding="utf-8")
    assert load_documents(path) == [Document("book.txt", "Line one.\nLine two.\n", str(path))]


def test_txt_folder_one_document_per_file_sorted(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.txt").write_text("bee", encoding="utf-8")
    (tmp_path / "a.txt").write_text("ay", encoding="utf-8")
    (tmp_path / "sub" / "c.txt").write_text("sea", encoding="utf-8")
    docs = load_documents(tmp_path)
    assert [(d.id, d.text) for d in docs] == [("a.txt", "ay"), ("b.txt", "bee"), ("sub/c.txt", "sea")]
    (tmp_path / "sub" / "notes.md").write_text("not .txt", encoding="utf-8")  # never left out without a word
    with pytest.raises(DataError, match=r"1 file\(s\) that are not \.txt \(sub/notes\.md\) would be left out"):
        load_documents(tmp_path)


def test_parquet(tmp_path):
    path = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"content": ["alpha", "beta", "gamma"], "name": ["x", "y", "z"]}), path)
    assert [(d.id, d.text) for d in load_documents(path, text_field="content", id_field="name")] == [
        ("x", "alpha"),
        ("y", "beta"),
        ("z", "gamma"),
    ]
    assert [d.id for d in load_documents(path, text_field="content")] == [
        "docs.parquet:0",
        "docs.parquet:1",
        "docs.parquet:2",
    ]


def test_save_to_disk_dataset_and_dataset_dict_split(tmp_path):
    import datasets

    single = datasets.Dataset.from_dict({"text": ["one", "two"], "label": [0, 1]})
    single.save_to_disk(str(tmp_path / "single"))
    docs = load_documents(tmp_path / "single")
    assert [(d.id, d.text) for d in docs] == [("single:0", "one"), ("single:1", "two")]

    both = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"story": ["t0", "t1"], "sid": ["s0", "s1"]}),
            "validation": datasets.Dataset.from_dict({"story": ["v0"], "sid": ["s9"]}),
        }
    )
    both.save_to_disk(str(tmp_path / "dict"))
    docs = load_documents(tmp_path / "dict", text_field="story", id_field="sid", split="validation")
    assert [(d.id, d.text) for d in docs] == [("s9", "v0")]
    docs = load_documents(tmp_path / "dict", text_field="story")
    assert [(d.id, d.text) for d in docs] == [("dict/train:0", "t0"), ("dict/train:1", "t1")]
    with pytest.raises(DataError, match=r"no split 'test'.*available splits: \['train', 'validation'\]"):
        load_documents(tmp_path / "dict", text_field="story", split="test")


# ---------------------------------------------------------------- default corpus


def test_default_corpus_is_real_sorted_and_deterministic(corpus):
    from pydoc_data.topics import topics

    assert len(corpus) >= 60
    assert [d.id for d in corpus] == sorted(topics)
    assert all(d.text == topics[d.id] for d in corpus)
    assert sum(len(d.text) for d in corpus) > 100_000
    assert corpus[0].source == f"pydoc_data.topics (Python {platform.python_version()})"
    assert default_corpus() == corpus
    assert load_documents(DEFAULT_CORPUS) == corpus


def test_default_corpus_reads_like_user_files(tmp_path, corpus):
    # The same records written as a user's JSON lines or Parquet load to the same ids and texts.
    rows = [{"id": d.id, "text": d.text} for d in corpus]
    from_jsonl = load_documents(write_jsonl(tmp_path / "c.jsonl", rows), id_field="id")
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "c.parquet")
    from_parquet = load_documents(tmp_path / "c.parquet", id_field="id")
    expected = [(d.id, d.text) for d in corpus]
    assert [(d.id, d.text) for d in from_jsonl] == expected
    assert [(d.id, d.text) for d in from_parquet] == expected


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("name", ["missing.jsonl", "sub/dir/missing", "./missing", "missing.csv"])
def test_missing_path_is_no_such_file_not_a_hub_lookup(tmp_path, name):
    # Relative names (resolved from the working directory, where none of them exists) that look like
    # paths: a data-file suffix, two separators, a leading dot. An absolute path too.
    with pytest.raises(DataError, match=re.escape(f"{name}: no such file or folder. Fix: check the path")):
        load_documents(name)
    with pytest.raises(DataError, match="no such file or folder"):
        load_documents(tmp_path / name)


def test_empty_files(tmp_path):
    (tmp_path / "empty.jsonl").write_bytes(b"")
    with pytest.raises(DataError, match=r"empty\.jsonl: empty file\. Fix: write one JSON object per line"):
        load_documents(tmp_path / "empty.jsonl")
    (tmp_path / "blank.jsonl").write_text("\n  \n", encoding="utf-8")
    with pytest.raises(DataError, match=r"blank\.jsonl: no documents"):
        load_documents(tmp_path / "blank.jsonl")
    (tmp_path / "empty.txt").write_text(" \n", encoding="utf-8")
    with pytest.raises(DataError, match=r"empty\.txt: empty file"):
        load_documents(tmp_path / "empty.txt")
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), tmp_path / "empty.parquet")
    with pytest.raises(DataError, match=r"empty\.parquet: no documents"):
        load_documents(tmp_path / "empty.parquet")


def test_malformed_json_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "ok"}\n{"text": "ok too"}\n{"text": oops}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"bad\.jsonl, line 3: malformed JSON.*Fix: write exactly one JSON object"):
        load_documents(path)


def test_json_line_that_is_not_an_object(tmp_path):
    path = write_jsonl(tmp_path / "list.jsonl", [{"text": "ok"}, ["not", "an", "object"]])
    with pytest.raises(DataError, match=r"list\.jsonl, line 2: expected an object with a 'text' field, got list"):
        load_documents(path)


def test_missing_text_field_lists_available_keys(tmp_path):
    path = write_jsonl(tmp_path / "keys.jsonl", [{"text": "fine"}, {"content": "x", "meta": 1}])
    with pytest.raises(DataError) as info:
        load_documents(path)
    message = str(info.value)
    assert "keys.jsonl, line 2: record has no field 'text'" in message
    assert "available keys: ['content', 'meta']" in message
    assert "Fix: choose the text field with --text-field <one of these>" in message


@pytest.mark.parametrize("value, type_name", [(3, "int"), (None, "NoneType"), (["a"], "list")])
def test_non_string_text(tmp_path, value, type_name):
    path = write_jsonl(tmp_path / "types.jsonl", [{"text": "fine"}, {"text": value}])
    with pytest.raises(DataError, match=rf"types\.jsonl, line 2: field 'text' holds a {type_name}, not a string"):
        load_documents(path)


def test_bad_ids(tmp_path):
    path = write_jsonl(tmp_path / "ids.jsonl", [{"text": "a", "id": "x"}, {"text": "b"}])
    with pytest.raises(
        DataError,
        match=r"ids\.jsonl, line 2: record has no id field 'id'; available keys: \['text'\]"
        r"\. Fix: choose the id field with --id-field <one of these>",
    ):
        load_documents(path, id_field="id")
    path = write_jsonl(tmp_path / "dup.jsonl", [{"text": "a", "id": "x"}, {"text": "b", "id": "x"}])
    with pytest.raises(
        DataError, match=r"dup\.jsonl, line 2: duplicate id 'x' \(first at line 1\)\. Fix: .*--id-field"
    ):
        load_documents(path, id_field="id")
    path = write_jsonl(tmp_path / "float.jsonl", [{"text": "a", "id": 1.5}])
    with pytest.raises(DataError, match=r"float\.jsonl, line 1: id field 'id' holds a float"):
        load_documents(path, id_field="id")


def test_all_texts_empty_is_an_error_but_some_empty_are_kept(tmp_path):
    path = write_jsonl(tmp_path / "hollow.jsonl", [{"text": ""}, {"text": "  "}])
    with pytest.raises(DataError, match=r"hollow\.jsonl: all 2 texts in field 'text' are empty"):
        load_documents(path)
    # Some empty texts are kept; select_documents counts them as too short (tested below).
    path = write_jsonl(tmp_path / "some.jsonl", [{"text": ""}, {"text": "words"}])
    assert [d.text for d in load_documents(path)] == ["", "words"]


def test_invalid_utf8_names_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(DataError, match=r"latin1\.jsonl, line 2: not valid UTF-8.*Fix: re-encode"):
        load_documents(path)


def test_unsupported_suffix_and_folder_without_text(tmp_path):
    (tmp_path / "table.csv").write_text("text\nhello\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"table\.csv: unsupported file type '\.csv'.*\.jsonl, \.txt, \.parquet"):
        load_documents(tmp_path / "table.csv")
    with pytest.raises(DataError, match=r"1 file\(s\) that are not \.txt \(table\.csv\)"):
        load_documents(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"folder holds no \.txt files and is not a datasets save_to_disk folder"):
        load_documents(tmp_path / "empty")


def test_parquet_bad_columns_and_values(tmp_path):
    path = tmp_path / "cols.parquet"
    pq.write_table(pa.table({"body": ["a"], "n": [1]}), path)
    missing = r"cols\.parquet, row 0: record has no field 'text'; available keys: \['body', 'n'\]"
    with pytest.raises(DataError, match=missing):
        load_documents(path)
    with pytest.raises(DataError, match=r"cols\.parquet, row 0: field 'n' holds a int, not a string"):
        load_documents(path, text_field="n")
    (tmp_path / "fake.parquet").write_text("not parquet", encoding="utf-8")
    with pytest.raises(DataError, match=r"fake\.parquet: cannot be read as Parquet"):
        load_documents(tmp_path / "fake.parquet")


def test_hub_name_offline_fails_with_data_error():
    # A fresh interpreter with the offline switches set before `datasets` is imported (they are read
    # at import time), so the real load_dataset call fails at once instead of retrying the network.
    code = (
        "from data import load_documents, DataError\n"
        "try:\n"
        "    load_documents('someone/nonexistent-dataset-xyz')\n"
        "except DataError as e:\n"
        "    print('DATAERROR', e)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("DATAERROR 'someone/nonexistent-dataset-xyz' is not a local file or folder")
    assert "not found locally" in result.stdout
    assert "network or the hub may be unreachable" in result.stdout
    assert "Fix: pass a local .jsonl" in result.stdout


# ---------------------------------------------------------------- tokenizer


def test_tokenizer_specials_and_round_trip(tokenizer):
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == ("<|bos|>", "<|eos|>", "<|pad|>")
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (0, 1, 2)
    assert len(tokenizer) == 1024
    texts = ["Hello  world , it's a test .", "  leading spaces\n\ttabs\r\n", "ünïcödé 日本語 🐟", "x"]
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == text
    assert tokenizer("plain text")["input_ids"] == tokenizer("plain text", add_special_tokens=False)["input_ids"]


def test_tokenizer_is_deterministic(corpus, tokenizer):
    again = train_bpe_tokenizer([doc.text for doc in corpus], vocab_size=1024)
    assert again.backend_tokenizer.to_str() == tokenizer.backend_tokenizer.to_str()


def test_tokenizer_save_and_load_give_identical_encodings(tmp_path, corpus, tokenizer, text_ids):
    from transformers import AutoTokenizer

    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert len(loaded) == len(tokenizer)
    assert (loaded.bos_token_id, loaded.eos_token_id, loaded.pad_token_id) == (0, 1, 2)
    texts = [doc.text for doc in corpus]
    assert loaded(texts, add_special_tokens=False)["input_ids"] == [text_ids[doc.id] for doc in corpus]
    reloaded = load_tokenizer(str(tmp_path))
    assert reloaded(texts[:5])["input_ids"] == [text_ids[doc.id] for doc in corpus[:5]]


def test_tokenizer_bad_input(tmp_path):
    with pytest.raises(DataError, match=r"vocab_size=100 is too small.*Fix: use vocab_size >= 259"):
        train_bpe_tokenizer(["some text"], vocab_size=100)
    with pytest.raises(DataError, match="all texts are empty"):
        train_bpe_tokenizer(["", " "])
    with pytest.raises(DataError, match="no such tokenizer folder"):
        load_tokenizer(str(tmp_path / "nowhere"))
    with pytest.raises(DataError, match="folder holds no tokenizer"):
        load_tokenizer(str(tmp_path))


def test_load_tokenizer_uses_eos_as_pad_when_missing(tmp_path, tokenizer):
    from transformers import PreTrainedTokenizerFast

    no_pad = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer.backend_tokenizer, bos_token="<|bos|>", eos_token="<|eos|>"
    )
    assert no_pad.pad_token is None
    no_pad.save_pretrained(tmp_path)
    loaded = load_tokenizer(tmp_path)
    assert loaded.pad_token == "<|eos|>" and loaded.pad_token_id == loaded.eos_token_id == 1


# ---------------------------------------------------------------- selection


def test_selection_is_deterministic_disjoint_and_fixed_length(corpus, tokenizer, text_ids):
    split = select_documents(corpus, tokenizer, n_train=20, n_heldout=10, seq_len=128, seed=3)
    again = select_documents(corpus, tokenizer, n_train=20, n_heldout=10, seq_len=128, seed=3)
    assert split == again
    other = select_documents(corpus, tokenizer, n_train=20, n_heldout=10, seq_len=128, seed=4)
    assert [d.id for d in other.train] != [d.id for d in split.train]
    assert len(split.train) == 20 and len(split.heldout) == 10
    assert not {d.id for d in split.train} & {d.id for d in split.heldout}
    by_id = {d.id: d for d in corpus}
    for doc in split.train + split.heldout:
        assert doc.token_ids == [tokenizer.bos_token_id] + text_ids[doc.id][:127]
        assert doc.text == by_id[doc.id].text
        assert doc.sha256 == hashlib.sha256(doc.text.encode("utf-8")).hexdigest()
    # The training set does not depend on how many held-out documents are asked for.
    fewer = select_documents(corpus, tokenizer, n_train=20, n_heldout=0, seq_len=128, seed=3)
    assert fewer.train == split.train and fewer.heldout == []


def test_too_short_counting_is_exact(corpus, tokenizer, text_ids):
    seq_len = 300
    lengths = {i: len(ids) + 1 for i, ids in text_ids.items()}  # + bos
    long_ids = {i for i, n in lengths.items() if n >= seq_len}
    # Asking for every long-enough document forces selection to examine the whole corpus.
    split = select_documents(corpus, tokenizer, n_train=len(long_ids) - 5, n_heldout=5, seq_len=seq_len)
    assert split.n_examined == split.n_candidates == len(corpus)
    assert set(split.too_short) == set(lengths) - long_ids and len(split.too_short) == len(corpus) - len(long_ids)
    assert {d.id for d in split.train + split.heldout} == long_ids
    # Without deduplication, asking for few documents examines fewer; every examined one is either kept or listed.
    small = select_documents(corpus, tokenizer, n_train=3, n_heldout=1, seq_len=seq_len, dedup=DedupConfig("off"))
    assert small.n_examined == 4 + len(small.too_short) <= len(corpus)
    assert all(lengths[i] < seq_len for i in small.too_short)


def test_cut_documents_and_their_dropped_tokens_are_counted(corpus, tokenizer, text_ids):
    seq_len = 128
    split = select_documents(corpus, tokenizer, n_train=20, n_heldout=10, seq_len=seq_len, seed=3)
    lengths = {d.id: len(text_ids[d.id]) + 1 for d in split.train + split.heldout}  # + bos
    longer = {i for i, n in lengths.items() if n > seq_len}
    assert longer and {d.id for d in split.cut} == longer  # the default corpus holds documents longer than 128
    assert split.tokens_cut == sum(lengths[i] - seq_len for i in longer)
    manifest = split.manifest()
    assert (manifest["n_cut"], manifest["tokens_cut"]) == (len(longer), split.tokens_cut)
    # Whole documents are never cut: every token is kept in full_ids.
    whole = select_documents(corpus, tokenizer, n_train=4, n_heldout=0, seq_len=64, whole_documents=64)
    assert whole.cut == [] and whole.manifest()["tokens_cut"] == 0


def test_empty_and_exact_length_documents(tokenizer):
    words = "one two three four five six seven eight nine ten"
    n_ids = len(tokenizer(words, add_special_tokens=False)["input_ids"])
    docs = [Document("empty", "", "t"), Document("exact", words, "t"), Document("short", "one", "t")]
    # bos + n_ids text ids = seq_len exactly: long enough, nothing truncated.
    split = select_documents(docs, tokenizer, n_train=1, n_heldout=0, seq_len=n_ids + 1)
    assert [d.id for d in split.train] == ["exact"] and len(split.train[0].token_ids) == n_ids + 1
    assert set(split.too_short) <= {"empty", "short"} and split.n_examined == len(split.too_short) + 1
    with pytest.raises(DataError, match=r"0 available \(3 documents, 3 too short\)"):
        select_documents(docs, tokenizer, n_train=1, n_heldout=0, seq_len=n_ids + 2)


def test_tokenizer_without_bos_starts_with_text_ids(tokenizer):
    from transformers import PreTrainedTokenizerFast

    no_bos = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer, eos_token="<|eos|>")
    text = "the quick brown fox jumps over the lazy dog " * 4
    split = select_documents([Document("fox", text, "t")], no_bos, n_train=1, n_heldout=0, seq_len=8)
    assert split.train[0].token_ids == no_bos(text, add_special_tokens=False)["input_ids"][:8]


def test_not_enough_documents_error(corpus, tokenizer):
    with pytest.raises(DataError) as info:
        select_documents(corpus, tokenizer, n_train=70, n_heldout=20, seq_len=256)
    message = str(info.value)  # found from the count alone, before any document is tokenized
    assert f"the source holds {len(corpus)}, but n_train + n_heldout = 70 + 20 = 90 are needed" in message
    assert "Fix: lower --n-train/--n-heldout, or give more documents" in message
    with pytest.raises(DataError) as info:
        select_documents(corpus, tokenizer, n_train=50, n_heldout=20, seq_len=4096)
    message = str(info.value)  # enough documents, too few of them long enough
    assert f"({len(corpus)} documents," in message and "too short)" in message
    assert "Fix: lower --n-train/--n-heldout or --seq-len, or give more" in message


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"seq_len": 1}, "seq_len must be >= 2"),
        ({"n_train": 0}, "n_train must be >= 1"),
        ({"n_heldout": -1}, "n_heldout must be >= 0"),
        ({"seq_len": 8.0}, "seq_len must be an integer"),
    ],
)
def test_selection_validates_sizes(corpus, tokenizer, kwargs, pattern):
    arguments = {"n_train": 2, "n_heldout": 1, "seq_len": 8, **kwargs}
    with pytest.raises(DataError, match=pattern):
        select_documents(corpus, tokenizer, **arguments)


def test_selection_rejects_duplicate_ids(tokenizer):
    docs = [Document("same", "some text here", "t"), Document("same", "other text here", "t")]
    with pytest.raises(DataError, match="document id 'same' occurs more than once"):
        select_documents(docs, tokenizer, n_train=1, n_heldout=0, seq_len=2)


def test_manifest_is_json_and_complete(corpus, tokenizer):
    split = select_documents(corpus, tokenizer, n_train=4, n_heldout=2, seq_len=64, seed=1)
    manifest = json.loads(json.dumps(split.manifest()))
    assert manifest["seq_len"] == 64 and manifest["seed"] == 1
    assert manifest["n_candidates"] == len(corpus) and manifest["n_examined"] == split.n_examined
    assert manifest["n_train"] == 4 and manifest["n_heldout"] == 2
    assert manifest["too_short"] == split.too_short and manifest["n_too_short"] == len(split.too_short)
    assert "examined" in manifest["too_short_scope"]
    assert manifest["train"] == [{"id": d.id, "sha256": d.sha256, "n_chars": len(d.text)} for d in split.train]
    assert [e["id"] for e in manifest["heldout"]] == [d.id for d in split.heldout]


def test_default_paragraphs_are_distinct_paragraphs_of_the_default_corpus() -> None:
    from data.documents import PARAGRAPH_MIN_CHARS

    paragraphs = load_documents("default-paragraphs")
    topics = {doc.id: doc.text for doc in load_documents("default")}
    assert len(paragraphs) > 500  # enough targets for 32 per bucket in five buckets
    assert len({p.text for p in paragraphs}) == len(paragraphs) == len({p.id for p in paragraphs})
    for paragraph in paragraphs:
        topic, _, index = paragraph.id.rpartition("#")
        assert len(paragraph.text) >= PARAGRAPH_MIN_CHARS and index.isdigit()
        assert paragraph.text in topics[topic] and "\n\n" not in paragraph.text
