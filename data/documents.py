"""Loading documents from files, folders, Hugging Face datasets and the embedded default corpus.

Every source is turned into records (mappings) that pass through one validation function,
`_documents_from_records`, so the default corpus, a user's JSON lines, Parquet rows and `datasets`
rows are checked by the same code.

Empty texts are kept, never dropped here: they cannot fill a sequence, so `select_documents` counts
and lists them with the other too-short documents. A source whose texts are ALL empty is an error.
"""

from __future__ import annotations

import json
import os
import platform
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data.chat import Message, conversation_of_record, conversation_text, is_conversation_record
from data.chat_corpus import conversation_records
from data.errors import DataError

DEFAULT_CORPUS = "default"
# The default corpus cut into paragraphs: hundreds of short, distinct documents, enough targets for a study with
# dozens of targets per repetition bucket.
DEFAULT_PARAGRAPHS = "default-paragraphs"
DEFAULT_CHAT = "default-chat"  # conversations derived from the paragraphs (data.chat_corpus)
PARAGRAPH_MIN_CHARS = 200

# Suffixes that make a string look like a file the user meant, not a Hugging Face dataset name.
_SUPPORTED_SUFFIXES = (".jsonl", ".txt", ".parquet")
_FILE_LIKE_SUFFIXES = frozenset(
    {".jsonl", ".json", ".txt", ".parquet", ".csv", ".tsv", ".arrow", ".gz", ".zst", ".bz2", ".xz", ".md"}
)
_LOCAL_FIX = (
    "pass a local .jsonl, .txt or .parquet file, a folder of .txt files, a folder written by "
    f"datasets' save_to_disk, '{DEFAULT_CORPUS}' for the embedded corpus, '{DEFAULT_PARAGRAPHS}' for its "
    f"paragraphs or '{DEFAULT_CHAT}' for conversations made from them"
)


@dataclass(frozen=True)
class Document:
    """One text to train or evaluate on.

    id: unique within its source (a record id, "<file>:<line or row>", or a file name).
    text: the full text, unmodified.
    source: where it came from (a path, a dataset name, or the default corpus' description).
    """

    id: str
    text: str
    source: str
    # A conversation (data.chat): its messages; text is then their plain rendering (data.chat.conversation_text).
    messages: tuple[Message, ...] | None = None


@dataclass(frozen=True)
class _Record:
    """A raw record before validation: `where` says where it sits ("line 3"), for messages."""

    where: str
    default_id: str
    fields: Any


def load_documents(
    source: str | os.PathLike,
    *,
    text_field: str = "text",
    id_field: str | None = None,
    split: str = "train",
) -> list[Document]:
    """Load documents from `source`, in the source's own order.

    source:
      - "default": the embedded default corpus (`default_corpus()`; text_field and id_field are
        ignored, it has its own fields); "default-paragraphs": its paragraphs (`default_paragraphs()`);
      - a `.jsonl` file: one JSON object per line, text in `text_field`, id in `id_field` or
        "<file name>:<line>" (1-based line); blank lines are skipped;
      - a `.txt` file (the whole file is one document, id = file name) or a folder of `.txt` files
        (searched recursively, one document per file in sorted path order, id = relative path);
      - a `.parquet` file: one document per row, text column `text_field`, id from `id_field` or
        "<file name>:<row>" (0-based row);
      - a folder written by `datasets`' `save_to_disk` (a Dataset, or a DatasetDict from which
        `split` is taken), id from `id_field` or "<folder name>:<row>" ("<folder name>/<split>:<row>"
        for a DatasetDict);
      - otherwise, when it is not an existing path and does not look like one, a Hugging Face
        dataset name loaded with `datasets.load_dataset(source, split=split)`.

    Raises DataError naming the file, line or row, and the fix, for: a missing path, an empty
    file or no documents, a malformed JSON line, a record without the text or id field, a text
    that is not a string, duplicate ids, an unsupported suffix, or a dataset that cannot be loaded.
    """
    if isinstance(source, str) and source == DEFAULT_CORPUS:
        return default_corpus()
    if isinstance(source, str) and source == DEFAULT_PARAGRAPHS:
        return default_paragraphs()
    if isinstance(source, str) and source == DEFAULT_CHAT:
        return default_chat()
    if not isinstance(source, (str, os.PathLike)):
        raise DataError(f"source must be a path or a dataset name, got {type(source).__name__}: {source!r}")
    if not isinstance(text_field, str) or not text_field:
        raise DataError(f"text_field must be a non-empty string, got {text_field!r}")
    if id_field is not None and (not isinstance(id_field, str) or not id_field):
        raise DataError(f"id_field must be a non-empty string or None, got {id_field!r}")

    path = Path(os.path.expanduser(os.fspath(source)))
    if path.is_dir():
        if _is_saved_dataset(path):
            return _load_saved_dataset(path, text_field=text_field, id_field=id_field, split=split)
        return _load_txt_folder(path)
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix == ".jsonl":
            return _load_jsonl(path, text_field=text_field, id_field=id_field)
        if suffix == ".txt":
            return _load_txt_file(path)
        if suffix == ".parquet":
            return _load_parquet(path, text_field=text_field, id_field=id_field)
        raise DataError(
            f"{path}: unsupported file type '{path.suffix or '(no suffix)'}'. "
            f"Supported: {', '.join(_SUPPORTED_SUFFIXES)}, a folder of .txt files, or a save_to_disk folder. "
            "Fix: convert the file (e.g. one JSON object per line with a 'text' field, saved as .jsonl)."
        )
    if isinstance(source, os.PathLike) or _looks_like_path(os.fspath(source)):
        raise DataError(f"{os.fspath(source)}: no such file or folder. Fix: check the path, or {_LOCAL_FIX}.")
    return _load_hub_dataset(os.fspath(source), text_field=text_field, id_field=id_field, split=split)


def default_corpus() -> list[Document]:
    """The embedded default corpus: the Python standard library's `pydoc_data.topics`.

    Real English documentation text (79 topics, about 465k characters in Python 3.11) written by the
    CPython authors and shipped with every Python installation, so it needs no download. One topic is
    one document, id = topic name, sorted by id. The content varies a little between Python
    versions, which is why the version is part of `source`.
    """
    from pydoc_data.topics import topics

    source = f"pydoc_data.topics (Python {platform.python_version()})"
    records = (
        _Record(where=f"topic {name!r}", default_id=name, fields={"id": name, "text": topics[name]})
        for name in sorted(topics)
    )
    return _documents_from_records(records, origin=source, source=source, text_field="text", id_field="id")


def default_paragraphs(min_chars: int = PARAGRAPH_MIN_CHARS) -> list[Document]:
    """The default corpus cut into paragraphs (runs of text between blank lines) of at least `min_chars`
    characters, leading and trailing whitespace removed, each text once: 628 in Python 3.11.

    A paragraph that occurs in several topics (the topics share sections) is kept once, at its first occurrence in
    topic order; id = "<topic>#<paragraph index in the topic>". Paragraphs of one topic are distinct texts, so
    they may land on both sides of a train / held-out split (near-duplicates among them are still found by the
    selection's deduplication).
    """
    seen: set[str] = set()
    records = []
    corpus = default_corpus()
    for doc in corpus:
        for index, paragraph in enumerate(re.split(r"\n[ \t]*\n", doc.text)):
            text = paragraph.strip()
            if len(text) < min_chars or text in seen:
                continue
            seen.add(text)
            name = f"{doc.id}#{index}"
            records.append(_Record(where=f"paragraph {name!r}", default_id=name, fields={"id": name, "text": text}))
    source = f"paragraphs of {corpus[0].source}"
    return _documents_from_records(records, origin=source, source=source, text_field="text", id_field="id")


def default_chat() -> list[Document]:
    """The embedded conversations (data.chat_corpus): one per paragraph of the embedded corpus, read through the same
    record check as a user's conversations."""
    source = f"conversations from paragraphs of pydoc_data.topics (Python {platform.python_version()})"
    records = (
        _Record(where=f"conversation {r['id']!r}", default_id=r["id"], fields=r)
        for r in conversation_records(default_paragraphs())
    )
    return _documents_from_records(records, origin=source, source=source, text_field="text", id_field="id")


def _documents_from_records(
    records: Iterable[_Record],
    *,
    origin: str,
    source: str,
    text_field: str,
    id_field: str | None,
) -> list[Document]:
    """Validate records and turn them into documents: the one check every source goes through.

    origin: the file or dataset named in error messages. source: stored in each Document.
    """
    documents: list[Document] = []
    first_seen: dict[str, str] = {}  # id -> where it was first seen, to report duplicates
    for record in records:
        fields = record.fields
        if not isinstance(fields, Mapping):
            raise DataError(
                f"{origin}, {record.where}: expected an object with a {text_field!r} field, "
                f"got {type(fields).__name__}. Fix: write one JSON object per record, e.g. "
                f'{{"{text_field}": "..."}}.'
            )
        if is_conversation_record(fields, text_field):
            messages = conversation_of_record(fields, f"{origin}, {record.where}")
            doc_id = record.default_id if id_field is None else _record_id(fields, id_field, origin, record.where)
            _check_unique(doc_id, record.where, first_seen, origin)
            text = conversation_text(messages)
            _check_encodable(text, "its messages", origin, record.where)
            _check_encodable(doc_id, "its id", origin, record.where)
            documents.append(Document(id=doc_id, text=text, source=source, messages=messages))
            continue
        if text_field not in fields:
            raise DataError(
                f"{origin}, {record.where}: record has no field {text_field!r}; available keys: "
                f"{sorted(map(str, fields))}. Fix: choose the text field with --text-field <one of these> "
                "(text_field= in Python), or add the field to every record."
            )
        text = fields[text_field]
        if not isinstance(text, str):
            raise DataError(
                f"{origin}, {record.where}: field {text_field!r} holds a {type(text).__name__}, not a "
                f"string ({_preview(text)}). Fix: store the document text as a string, or choose "
                "another field with --text-field."
            )
        doc_id = record.default_id if id_field is None else _record_id(fields, id_field, origin, record.where)
        _check_unique(doc_id, record.where, first_seen, origin)
        _check_encodable(text, f"field {text_field!r}", origin, record.where)
        _check_encodable(doc_id, "its id", origin, record.where)
        documents.append(Document(id=doc_id, text=text, source=source))
    if not documents:
        raise DataError(f"{origin}: no documents (the source is empty). Fix: {_LOCAL_FIX}.")
    if all(not doc.text.strip() for doc in documents):
        raise DataError(
            f"{origin}: all {len(documents)} texts in field {text_field!r} are empty. "
            "Fix: choose the field that holds the text with --text-field (text_field= in Python), or fill the texts."
        )
    return documents


_SURROGATE = re.compile("[\ud800-\udfff]")


def _check_encodable(text: str, what: str, origin: str, where: str) -> None:
    """Refuse a lone UTF-16 surrogate (JSON's "\\ud800" escape decodes to one): no tokenizer, hash or file can
    encode it, and it would fail far from here without naming the record."""
    found = _SURROGATE.search(text)
    if found:
        raise DataError(
            f"{origin}, {where}: {what} holds a lone surrogate (U+{ord(found.group()):04X} at character "
            f"{found.start()}), which is not text. Fix: remove it, or write the character it was part of whole."
        )


def _check_unique(doc_id: str, where: str, first_seen: dict[str, str], origin: str) -> None:
    if doc_id in first_seen:
        raise DataError(
            f"{origin}, {where}: duplicate id {doc_id!r} (first at {first_seen[doc_id]}). "
            "Fix: make the ids unique, or leave --id-field unset to use <file>:<line> ids."
        )
    first_seen[doc_id] = where


def _record_id(fields: Mapping, id_field: str, origin: str, where: str) -> str:
    if id_field not in fields:
        raise DataError(
            f"{origin}, {where}: record has no id field {id_field!r}; available keys: "
            f"{sorted(map(str, fields))}. Fix: choose the id field with --id-field <one of these> "
            "(id_field= in Python), or leave --id-field unset to use <file>:<line> ids."
        )
    value = fields[id_field]
    # bool is an int subclass but never a meaningful id.
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise DataError(
            f"{origin}, {where}: id field {id_field!r} holds a {type(value).__name__} "
            f"({_preview(value)}), not a string or integer. Fix: use string or integer ids."
        )
    return str(value)


def is_local_source(source: str | os.PathLike) -> bool:
    """True when load_documents(source) reads the embedded corpus or a local path (no network): a source a
    launcher can check cheaply before starting worker processes."""
    if not isinstance(source, (str, os.PathLike)):
        return False
    return (
        source in (DEFAULT_CORPUS, DEFAULT_PARAGRAPHS, DEFAULT_CHAT)
        or isinstance(source, os.PathLike)
        or _looks_like_path(source)
        or Path(os.path.expanduser(source)).exists()
    )


def _preview(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _looks_like_path(source: str) -> bool:
    """True when `source` is meant as a local path rather than an "owner/name" dataset id."""
    return (
        source.startswith((".", "/", "~"))
        or "\\" in source
        or source.count("/") >= 2
        or source.endswith("/")
        or Path(source).suffix.lower() in _FILE_LIKE_SUFFIXES
    )


def read_utf8(path: Path, data: bytes, where: str) -> str:
    """`data` (read from `path`) as UTF-8 text; DataError naming the file, `where` in it and the byte offset."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise DataError(
            f"{path}, {where}: not valid UTF-8 (byte {error.start}: {error.reason}). Fix: re-encode the file as UTF-8."
        ) from None


def _load_jsonl(path: Path, *, text_field: str, id_field: str | None) -> list[Document]:
    def records() -> Iterator[_Record]:
        with path.open("rb") as handle:
            for number, raw in enumerate(handle, start=1):
                line = read_utf8(path, raw, f"line {number}")
                if number == 1:
                    line = line.removeprefix("\ufeff")  # a UTF-8 byte-order mark is not JSON
                if not line.strip():
                    continue
                try:
                    fields = json.loads(line)
                except json.JSONDecodeError as error:
                    raise DataError(
                        f"{path}, line {number}: malformed JSON ({error.msg} at column {error.colno}). "
                        "Fix: write exactly one JSON object per line."
                    ) from None
                except RecursionError:
                    raise DataError(
                        f"{path}, line {number}: JSON nested too deeply to read. Fix: write one flat JSON object "
                        "per line (the document's text as a string)."
                    ) from None
                except ValueError as error:  # a number of more than 4,300 digits (int's conversion limit)
                    reason = "a number of more than 4,300 digits" if "digits" in str(error) else str(error)
                    raise DataError(
                        f"{path}, line {number}: unreadable JSON ({reason}). Fix: correct that line"
                    ) from None
                yield _Record(where=f"line {number}", default_id=f"{path.name}:{number}", fields=fields)

    if path.stat().st_size == 0:
        raise DataError(f'{path}: empty file. Fix: write one JSON object per line, e.g. {{"{text_field}": "..."}}.')
    return _documents_from_records(
        records(), origin=str(path), source=str(path), text_field=text_field, id_field=id_field
    )


def _load_txt_file(path: Path) -> list[Document]:
    text = read_utf8(path, path.read_bytes(), "whole file")
    if not text.strip():
        raise DataError(f"{path}: empty file (no text). Fix: pass a file that holds the document's text.")
    record = _Record(where="whole file", default_id=path.name, fields={"text": text})
    return _documents_from_records([record], origin=str(path), source=str(path), text_field="text", id_field=None)


def txt_files(folder: Path) -> list[Path]:
    """The .txt files of a folder source (searched recursively, in sorted path order). Anything else in it is
    refused, named: a file of another type or a broken link would otherwise be left out without a word."""
    files, other, broken = [], [], []
    for path in sorted(folder.rglob("*")):
        if path.is_symlink() and not path.exists():
            broken.append(path)
        elif path.is_file():
            (files if path.suffix.lower() == ".txt" else other).append(path)
    if broken:
        raise DataError(
            f"{folder}: {len(broken)} broken link(s), e.g. {broken[0].relative_to(folder)} (its target is "
            "missing), would be left out. Fix: restore the target or remove the link"
        )
    if other:
        shown = ", ".join(p.relative_to(folder).as_posix() for p in other[:3]) + (", ..." if len(other) > 3 else "")
        raise DataError(
            f"{folder}: {len(other)} file(s) that are not .txt ({shown}) would be left out: a folder source reads "
            ".txt files only. Fix: move them out of the folder, or convert them to .txt"
        )
    return files


def _load_txt_folder(folder: Path) -> list[Document]:
    files = txt_files(folder)
    if not files:
        raise DataError(
            f"{folder}: folder holds no .txt files and is not a datasets save_to_disk folder. Fix: {_LOCAL_FIX}."
        )

    def records() -> Iterator[_Record]:
        for file in files:
            relative = file.relative_to(folder).as_posix()
            text = read_utf8(file, file.read_bytes(), "whole file")
            yield _Record(where=f"file {relative}", default_id=relative, fields={"text": text})

    return _documents_from_records(records(), origin=str(folder), source=str(folder), text_field="text", id_field=None)


def _load_parquet(path: Path, *, text_field: str, id_field: str | None) -> list[Document]:
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except Exception as error:  # pyarrow raises several types for a damaged or foreign file
        raise DataError(
            f"{path}: cannot be read as Parquet ({type(error).__name__}: {error}). "
            "Fix: check that the file is a valid Parquet file."
        ) from None

    def records() -> Iterator[_Record]:
        row = 0
        for batch in parquet.iter_batches():
            for fields in batch.to_pylist():
                yield _Record(where=f"row {row}", default_id=f"{path.name}:{row}", fields=fields)
                row += 1

    return _documents_from_records(
        records(), origin=str(path), source=str(path), text_field=text_field, id_field=id_field
    )


def _is_saved_dataset(folder: Path) -> bool:
    """A folder written by `Dataset.save_to_disk` or `DatasetDict.save_to_disk`."""
    return (folder / "dataset_dict.json").is_file() or (
        (folder / "state.json").is_file() and (folder / "dataset_info.json").is_file()
    )


def _load_saved_dataset(folder: Path, *, text_field: str, id_field: str | None, split: str) -> list[Document]:
    import datasets

    try:
        loaded = datasets.load_from_disk(str(folder))
    except Exception as error:  # datasets raises several types for a damaged folder
        raise DataError(
            f"{folder}: looks like a datasets save_to_disk folder but cannot be loaded "
            f"({type(error).__name__}: {error}). Fix: save it again with save_to_disk."
        ) from None
    origin, id_prefix = str(folder), folder.name
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise DataError(
                f"{folder}: has no split {split!r}; available splits: {sorted(loaded)}. "
                "Fix: choose one of them with --split (split= in Python)."
            )
        loaded = loaded[split]
        origin, id_prefix = f"{folder} (split {split!r})", f"{folder.name}/{split}"
    return _documents_from_dataset(loaded, origin=origin, id_prefix=id_prefix, text_field=text_field, id_field=id_field)


def _load_hub_dataset(name: str, *, text_field: str, id_field: str | None, split: str) -> list[Document]:
    import datasets

    try:
        loaded = datasets.load_dataset(name, split=split)
    except Exception as error:  # network, not-found and bad-split errors all come through here
        raise DataError(
            f"{name!r} is not a local file or folder, and loading it as a Hugging Face dataset "
            f"(split {split!r}) failed: {type(error).__name__}: {error}. The dataset was not found "
            "locally (nor in the datasets cache), and the network or the hub may be unreachable. "
            f"Fix: {_LOCAL_FIX}; or, where a network is available, load the dataset and save it with "
            "save_to_disk, then pass that folder."
        ) from None
    return _documents_from_dataset(
        loaded,
        origin=f"dataset {name!r} (split {split!r})",
        id_prefix=f"{name}/{split}",
        text_field=text_field,
        id_field=id_field,
    )


def _documents_from_dataset(
    dataset: Any, *, origin: str, id_prefix: str, text_field: str, id_field: str | None
) -> list[Document]:
    """Rows of a `datasets.Dataset` -> documents (0-based row ids "<prefix>:<row>")."""
    wanted = [f for f in (text_field, id_field) if f is not None]
    if all(f in dataset.column_names for f in wanted):
        # Skip decoding columns we do not use (images, long metadata); a missing column is left to
        # the record check so the message is the same as for any other source.
        dataset = dataset.select_columns(wanted)
    records = (
        _Record(where=f"row {row}", default_id=f"{id_prefix}:{row}", fields=fields)
        for row, fields in enumerate(dataset)
    )
    return _documents_from_records(records, origin=origin, source=origin, text_field=text_field, id_field=id_field)
