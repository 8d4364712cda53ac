"""A background corpus tokenized once into a memory-mapped Arrow cache, read a document at a time.

`tokenize_corpus(source, tokenizer)` loads any source `load_documents` accepts (plus the built-in
"python-stdlib": the Python standard library's own source files, and "python-docstrings": their docstrings) as a
`datasets.Dataset` backed by Arrow files on
disk (memory-mapped: reading it does not bring it into memory), and tokenizes it with a batched `map` over
`workers` processes, cached, so a second run with the same corpus and tokenizer reads the cache.
Each document becomes its ids (bos first when the tokenizer has one, no EOS: the stream adds it), its length, and
a 64-bit key of its normalized text and a sample of its word-shingle hashes (for removing exact and near copies of
target documents, data.dedup.sampled_shingles).

Memory: the corpus holds only its (N,) int64 lengths; `ids(i)` reads one document from the mapped file.

The cache is keyed by content: the sha256 of the source files' bytes (local files, a folder, "python-stdlib"; a hub
or save_to_disk dataset by datasets' own fingerprint), the tokenizer (datasets' hash of it) and the text field. A
rewritten file is tokenized again, never read from an older entry. An entry is used only after its integrity is
checked: the text read back from a local source's cached Arrow equals the files' bytes, and every tokenized Arrow
file has the sha256 its manifest (written last, once the entry is complete) records; anything else (a half-written,
edited or planted entry) is removed and rebuilt.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import sysconfig
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from data.atomic import write_json_atomic
from data.dedup import normalized_text, sampled_shingles
from data.documents import DEFAULT_CORPUS, _is_saved_dataset, _looks_like_path, default_corpus, read_utf8, txt_files
from data.errors import DataError

PYTHON_STDLIB = "python-stdlib"
# English prose that ships with every Python: the docstrings of the same files, one document each.
PYTHON_DOCSTRINGS = "python-docstrings"
DOCSTRING_MIN_CHARS = 50
# Left out of "python-stdlib": tests, vendored packages, and pydoc_data, which holds the default corpus' text (the
# targets of the embedded corpus study must not be in its background).
_STDLIB_SKIP = frozenset(
    {"test", "tests", "idle_test", "site-packages", "dist-packages", "pydoc_data", "lib2to3", "__pycache__"}
)


# Bump when the tokenized columns or the code computing them (encode in tokenize_corpus, text_key,
# data.dedup.sampled_shingles) change: entries of another format are never read.
CACHE_FORMAT = 1
_HASH_CHUNK = 1 << 20


def text_key(text: str) -> int:
    """A 63-bit key of the normalized text (data.dedup.normalized_text): equal keys mean the same text up to case,
    punctuation and whitespace."""
    return int.from_bytes(hashlib.sha256(normalized_text(text).encode("utf-8")).digest()[:8], "little") >> 1


def stdlib_files() -> list[Path]:
    """The .py files of this Python's standard library (sorted; tests, vendored code and pydoc_data left out)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py") if not _STDLIB_SKIP.intersection(p.relative_to(root).parts))


class TokenizedCorpus:
    """The tokenized documents of a corpus: (N,) lengths in memory, ids read one document at a time from Arrow.

    dataset: a datasets.Dataset with columns "ids" (list of int), "n_tokens" (int), "key" (int64) and "shingles"
    (list of int64).
    """

    def __init__(self, dataset: Any, source: str, fingerprint: str | None = None) -> None:
        self.dataset = dataset
        self.source = source
        self._fingerprint = fingerprint if fingerprint is not None else str(dataset._fingerprint)
        self.budget: int | None = None  # a streamed corpus: the tokens it was read up to (stream_corpus)
        self.lengths = dataset.data.column("n_tokens").to_numpy().astype(np.int64)  # (N,)
        self._ids = dataset.select_columns(["ids"])

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def n_tokens(self) -> int:
        return int(self.lengths.sum())

    def ids(self, index: int) -> list[int]:
        """Document `index`'s token ids (bos first when the tokenizer has one)."""
        return self._ids[int(index)]["ids"]

    def keys(self) -> np.ndarray:
        """(N,) int64 text keys (`text_key`), read from the mapped file."""
        return self.dataset.data.column("key").to_numpy().astype(np.int64)

    def samples(self, indices: Sequence[int]) -> list[list[int]]:
        """The sampled shingle hashes (data.dedup.sampled_shingles) of the documents at `indices`, in that order."""
        if not len(indices):
            return []
        return self.dataset.data.column("shingles").take(np.asarray(indices, dtype=np.int64)).to_pylist()

    def containing(
        self, samples: Sequence[Sequence[int]], threshold: float, chunk: int = 4096
    ) -> list[tuple[int, int, float]]:
        """The documents that hold a target's text: (document, target, containment) for every pair whose
        containment (the fraction of target t's sampled shingle hashes `samples[t]` found among the document's,
        data.dedup.sampled_shingles) is >= threshold. Reads `chunk` documents' hashes at a time from the mapped
        file, so memory does not grow with the corpus. Targets with an empty sample are never matched."""
        import pyarrow.compute as pc

        owners: dict[int, list[int]] = {}
        for target, sample in enumerate(samples):
            for value in set(sample):
                owners.setdefault(int(value), []).append(target)
        if not owners:
            return []
        wanted = np.fromiter(owners, dtype=np.int64, count=len(owners))
        column = self.dataset.data.column("shingles")
        hits: dict[tuple[int, int], int] = {}
        for offset in range(0, len(self), chunk):
            part = column.slice(offset, chunk).combine_chunks()
            values = pc.list_flatten(part).to_numpy(zero_copy_only=False)
            parents = pc.list_parent_indices(part).to_numpy(zero_copy_only=False)
            found = np.isin(values, wanted)
            for value, parent in zip(values[found].tolist(), parents[found].tolist()):
                for target in owners[value]:
                    hits[(offset + parent, target)] = hits.get((offset + parent, target), 0) + 1
        sizes = [len(set(sample)) for sample in samples]
        return sorted(
            (document, target, count / sizes[target])
            for (document, target), count in hits.items()
            if count / sizes[target] >= threshold
        )

    def fingerprint(self) -> str:
        """The corpus' cache key (datasets' fingerprint for a streamed one): it changes with the corpus' content and
        the tokenizer."""
        return self._fingerprint


def stdlib_docstrings(files: Sequence[Path] | None = None) -> list[str]:
    """The docstrings of the standard library's files (`stdlib_files`) of at least DOCSTRING_MIN_CHARS characters, in
    file order and, within a file, in the order `ast.walk` meets the module, classes and functions. Files are parsed,
    never imported or run; one that does not parse (a Python 2 fixture) is skipped."""
    texts = []
    for path in stdlib_files() if files is None else files:
        try:
            tree = ast.parse(read_utf8(path, path.read_bytes(), "whole file"))
        except (SyntaxError, ValueError, DataError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                text = ast.get_docstring(node)
                if text is not None and len(text) >= DOCSTRING_MIN_CHARS:
                    texts.append(text)
    return texts


def _docstrings_dataset(cache: str | None) -> Any:
    """The "python-docstrings" source as a disk-backed dataset, cached under the digest of the files' bytes (and of the
    docstrings' own text, so a cached entry holding other text is rebuilt)."""
    texts = stdlib_docstrings()
    return _checked_text_dataset(
        _listed_texts,
        {"texts": texts},
        _text_digest(texts),
        f"goldfish-docstrings-{CACHE_FORMAT}",
        cache,
        f"background {PYTHON_DOCSTRINGS!r}: its cached rows differ from the docstrings. Fix: run again",
    )


def _text_digest(texts: Iterable[str]) -> str:
    """sha256 of texts, each after its UTF-8 length: files_digest's scheme, for texts held in memory."""
    digest = hashlib.sha256()
    for text in texts:
        content = text.encode("utf-8")
        digest.update(len(content).to_bytes(8, "little"))
        digest.update(content)
    return digest.hexdigest()


def _checked_text_dataset(
    generator: Any, gen_kwargs: dict[str, Any], digest: str, name: str, cache: str | None, changed: str
) -> Any:
    """A disk-backed dataset of the generator's rows, cached under `name` and `digest` (the digest of the texts it
    yields), used only when its "text" column has that digest: an entry holding other text (edited or planted) is
    removed and written again once; DataError(`changed`) if it still differs."""
    import datasets

    for _ in range(2):
        loaded = datasets.Dataset.from_generator(
            generator, gen_kwargs=gen_kwargs | {"digest": digest}, cache_dir=cache, fingerprint=f"{name}-{digest}"
        )
        if _texts_digest(loaded) == digest:
            return loaded
        for entry in {Path(f["filename"]).parent for f in loaded.cache_files}:
            shutil.rmtree(entry, ignore_errors=True)
        del loaded
    raise DataError(changed)


def _listed_texts(texts: list[str], digest: str) -> Iterator[dict[str, str]]:
    """Rows of in-memory texts; `digest` (of the texts) keys datasets' cache of them."""
    for text in texts:
        yield {"text": text}


def load_raw_corpus(
    source: str, *, text_field: str = "text", split: str = "train", cache_dir: str | os.PathLike | None = None
) -> Any:
    """The corpus as a disk-backed datasets.Dataset with one column "text" (its documents, in the source's order).

    Files are converted to Arrow by datasets' builders (json, parquet, text) or written from a generator, so the
    text never has to fit in memory. Raises DataError naming the source and the fix.
    """
    import datasets

    cache = None if cache_dir is None else str(cache_dir)
    path = Path(os.path.expanduser(source))
    try:
        files = text_source_files(source)
        if files is not None:
            loaded = _text_files_dataset(source, files, cache)
        elif source == DEFAULT_CORPUS:
            loaded = datasets.Dataset.from_dict({"text": [d.text for d in default_corpus()]})
        elif source == PYTHON_DOCSTRINGS:
            loaded = _docstrings_dataset(cache)
        elif path.is_dir() and _is_saved_dataset(path):
            loaded = datasets.load_from_disk(str(path))
            if isinstance(loaded, datasets.DatasetDict):
                if split not in loaded:
                    raise DataError(
                        f"{path}: has no split {split!r}; available: {sorted(loaded)}. Fix: choose one with --split"
                    )
                loaded = loaded[split]
        elif path.is_file():
            builder = {".jsonl": "json", ".parquet": "parquet"}.get(path.suffix.lower())
            if builder is None:
                raise DataError(
                    f"{path}: unsupported file type {path.suffix!r} for a background corpus. Fix: use a "
                    ".jsonl, .txt or .parquet file, a folder of .txt files or a save_to_disk folder"
                )
            else:
                # named by the file's sha256: datasets keys its cache of a local file by path and modification
                # time, so a file rewritten with its old time would be read from the old rows
                loaded = datasets.load_dataset(
                    builder,
                    name=f"goldfish-{_file_sha256(path)}",
                    data_files=str(path),
                    split="train",
                    cache_dir=cache,
                )
        elif _looks_like_path(source):
            raise DataError(f"{source}: no such file or folder. Fix: check the --background path")
        else:
            loaded = datasets.load_dataset(source, split=split, cache_dir=cache)
    except DataError:
        raise
    except Exception as error:  # datasets raises many types for unreadable or unreachable data
        raise DataError(
            f"background {source!r} cannot be loaded ({type(error).__name__}: {error}). Fix: pass a local "
            f"file or folder, {PYTHON_STDLIB!r}, {PYTHON_DOCSTRINGS!r}, or a dataset saved with save_to_disk"
        ) from None
    if text_field not in loaded.column_names and "text" not in loaded.column_names:
        raise DataError(
            f"background {source!r} has no field {text_field!r}; available: {loaded.column_names}. "
            "Fix: choose it with --background-text-field"
        )
    field = text_field if text_field in loaded.column_names else "text"
    return (
        loaded.select_columns([field]).rename_column(field, "text")
        if field != "text"
        else loaded.select_columns(["text"])
    )


def open_stream(source: str, *, split: str = "train") -> Any:
    """The corpus as a `datasets.IterableDataset`, read lazily in the source's order: a hub dataset is streamed
    (`load_dataset(..., streaming=True)`: nothing is downloaded beyond what is read), local files are read as they
    are iterated. The same sources as `load_raw_corpus`. Raises DataError naming the source and the fix."""
    import datasets

    path = Path(os.path.expanduser(source))
    try:
        files = text_source_files(source)
        if files is not None:
            return datasets.IterableDataset.from_generator(_files_text, gen_kwargs={"files": [str(f) for f in files]})
        if source == DEFAULT_CORPUS:
            return datasets.Dataset.from_dict({"text": [d.text for d in default_corpus()]}).to_iterable_dataset()
        if source == PYTHON_DOCSTRINGS:
            return datasets.Dataset.from_dict({"text": stdlib_docstrings()}).to_iterable_dataset()
        if path.is_dir() and _is_saved_dataset(path):
            return load_raw_corpus(source, split=split).to_iterable_dataset()  # on disk already: read it in order
        if path.is_file():
            builder = {".jsonl": "json", ".parquet": "parquet"}.get(path.suffix.lower())
            if builder is None:
                raise DataError(
                    f"{path}: unsupported file type {path.suffix!r} for a background corpus. Fix: use a "
                    ".jsonl, .txt or .parquet file, a folder of .txt files or a save_to_disk folder"
                )
            return datasets.load_dataset(builder, data_files=str(path), split="train", streaming=True)
        if _looks_like_path(source):
            raise DataError(f"{source}: no such file or folder. Fix: check the --background path")
        return datasets.load_dataset(source, split=split, streaming=True)
    except DataError:
        raise
    except Exception as error:  # datasets raises many types for unreadable or unreachable data
        raise DataError(
            f"background {source!r} cannot be streamed ({type(error).__name__}: {error}). Fix: check the dataset "
            "name and split (and the network), or pass a local file or folder"
        ) from None


def stream_corpus(
    source: str,
    tokenizer: Any,
    token_budget: int,
    *,
    text_field: str = "text",
    split: str = "train",
    cache_dir: str | os.PathLike | None = None,
    progress: bool = True,
) -> TokenizedCorpus:
    """Tokenize the first documents of a streamed corpus, in the stream's order, until they hold `token_budget`
    tokens (or the stream ends), into the memory-mapped form `tokenize_corpus` makes.

    Only those documents are read: the rest of a hub dataset is never downloaded. Documents are tokenized in
    batches as they arrive and written to Arrow in batches (`datasets.Dataset.from_generator`), so memory holds
    one batch, not the prefix. The result is cached under `cache_dir`, keyed by the source, split, field,
    tokenizer and budget (and a local text source's content). A cached entry is used only when its Arrow files have
    the sha256 its manifest (cache_dir/streamed/KEY.json, written last) records; otherwise the stream is read
    again into an entry of a fresh name (`_stream_manifest`). `corpus.budget` is the budget; `corpus.n_tokens` what
    was read (less when the stream ended first). Raises DataError for a source that cannot be streamed, lacks the
    field, or holds no text.
    """
    import datasets
    from datasets.fingerprint import Hasher

    if isinstance(token_budget, bool) or not isinstance(token_budget, int) or token_budget < 1:
        raise DataError(f"a streamed corpus needs a token budget >= 1, got {token_budget!r}")
    open_stream(source, split=split)  # fail here, with one line, before the cache's generator runs
    files = text_source_files(source)
    identity = {
        "format": CACHE_FORMAT,
        "source": source,
        "split": split,
        "text_field": text_field,
        "tokenizer": Hasher.hash(tokenizer),
        "budget": token_budget,
        "content": files_digest(files) if files is not None else _local_file_sha256(source),
    }
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode("utf-8")).hexdigest()[:40]

    def build(name: str) -> Any:
        """The entry named `name` (read from the cache when it is there, else streamed into it)."""
        return datasets.Dataset.from_generator(
            _stream_rows,
            gen_kwargs={
                "source": source,
                "split": split,
                "text_field": text_field,
                "tokenizer": tokenizer,
                "token_budget": token_budget,
                "progress": progress,
                "content": identity["content"],
            },
            cache_dir=None if cache_dir is None else str(cache_dir),
            fingerprint=name,
            features=datasets.Features(
                {
                    "ids": datasets.List(datasets.Value("int64")),
                    "n_tokens": datasets.Value("int64"),
                    "key": datasets.Value("int64"),
                    "shingles": datasets.List(datasets.Value("int64")),
                }
            ),
        )

    enabled = datasets.is_progress_bar_enabled()
    if not progress:
        datasets.disable_progress_bar()
    try:
        tokenized = _stream_manifest(build, key, None if cache_dir is None else Path(cache_dir) / "streamed")
    except DataError:
        raise
    except datasets.exceptions.DatasetGenerationError as error:
        cause = error.__cause__ or error.__context__
        if isinstance(cause, DataError):
            raise cause from None
        raise
    finally:
        if enabled and not progress:
            datasets.enable_progress_bar()
    if len(tokenized) == 0 or not any(tokenized.data.column("n_tokens").to_numpy()):
        raise DataError(f"background {source!r} holds no text. Fix: choose the field with --background-text-field")
    corpus = TokenizedCorpus(tokenized, source, key)
    corpus.budget = token_budget
    return corpus


def _stream_manifest(build: Any, key: str, folder: Path | None) -> Any:
    """The streamed entry of `key`: the one its manifest (folder/KEY.json) names, when its Arrow files still have the
    recorded sha256; else a fresh one, streamed under a name no earlier entry has (KEY-NONCE, so nothing planted
    or left over under a predictable name is ever read), whose manifest is then written."""
    import secrets

    if folder is None:  # no cache folder of ours: datasets' default cache, unchecked
        return build(key)
    manifest_path = folder / f"{key}.json"
    try:
        manifest = json.loads(manifest_path.read_text())
        recorded = manifest.get("format") == CACHE_FORMAT and manifest.get("key") == key
        if recorded and all(Path(f["name"]).is_file() for f in manifest["files"]):  # else it would stream again
            dataset = build(f"{key}-{manifest['nonce']}")
            found = [{"name": f["filename"], "sha256": _file_sha256(Path(f["filename"]))} for f in dataset.cache_files]
            if found == manifest["files"] and len(dataset) == manifest["rows"]:
                return dataset
            for entry in {Path(f["filename"]).parent for f in dataset.cache_files}:  # not what was written
                shutil.rmtree(entry, ignore_errors=True)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    nonce = secrets.token_hex(8)
    dataset = build(f"{key}-{nonce}")
    files = [{"name": f["filename"], "sha256": _file_sha256(Path(f["filename"]))} for f in dataset.cache_files]
    manifest = {"format": CACHE_FORMAT, "key": key, "nonce": nonce, "rows": len(dataset), "files": files}
    write_json_atomic(manifest_path, manifest)
    return dataset


def _stream_rows(
    source: str,
    split: str,
    text_field: str,
    tokenizer: Any,
    token_budget: int,
    progress: bool,
    content: str | None = None,
    batch: int = 64,
) -> Iterator[dict[str, Any]]:
    """Rows of `stream_corpus`: read and tokenize `batch` documents at a time until the budget is met. `content` (the
    files' digest of a local source) is not read: it keys datasets' cache of the rows."""
    from tqdm.auto import tqdm

    stream = open_stream(source, split=split)
    bos = getattr(tokenizer, "bos_token_id", None)
    total, texts = 0, []
    bar = tqdm(total=token_budget, unit="tok", desc=f"streaming {source}", disable=not progress)
    try:
        rows = iter(stream)
        while total < token_budget:
            texts = []
            for row in rows:
                if text_field not in row and "text" not in row:
                    raise DataError(
                        f"background {source!r} has no field {text_field!r}; available: {sorted(row)}. "
                        "Fix: choose it with --background-text-field"
                    )
                value = row.get(text_field, row.get("text"))
                texts.append(value if isinstance(value, str) else "")
                if len(texts) == batch:
                    break
            if not texts:
                break  # the stream ended before the budget
            encoded = tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
            for text, tokens in zip(texts, encoded):
                ids = ([bos] if bos is not None else []) + list(tokens) if tokens else []
                yield {"ids": ids, "n_tokens": len(ids), "key": text_key(text), "shingles": sampled_shingles(text)}
                total += len(ids)
                bar.update(len(ids))
                if total >= token_budget:
                    break
    finally:
        bar.close()


def _files_text(files: list[str], digest: str | None = None) -> Iterator[dict[str, str]]:
    """One row per file, its text. `digest` (files_digest) is not read: being among the generator's arguments, it
    keys datasets' cache of the rows by the files' content, not only their names."""
    for name in files:
        yield {"text": read_utf8(Path(name), Path(name).read_bytes(), "whole file")}


def text_source_files(source: str) -> list[Path] | None:
    """The files of a source made of text files, one document each: "python-stdlib", a folder of .txt files, a .txt
    file; None for any other source. A folder holding other files or broken links, or no .txt file, is refused."""
    path = Path(os.path.expanduser(source))
    if source == PYTHON_STDLIB:
        return stdlib_files()
    if source == DEFAULT_CORPUS or not path.exists():
        return None
    if path.is_dir() and not _is_saved_dataset(path):
        files = txt_files(path)
        if not files:
            raise DataError(
                f"{path}: folder holds no .txt files. Fix: pass a folder of .txt files, a .jsonl, .txt or .parquet "
                f"file, or {PYTHON_STDLIB!r}"
            )
        return files
    if path.is_file() and path.suffix.lower() == ".txt":
        return [path]
    return None


def files_digest(files: Sequence[Path]) -> str:
    """sha256 of the files' bytes, in order, each after its length. Each file must be UTF-8: DataError naming the
    file and the byte offset otherwise (as for --data; nothing is replaced)."""
    digest = hashlib.sha256()
    for path in files:
        content = path.read_bytes()
        read_utf8(path, content, "whole file")
        digest.update(len(content).to_bytes(8, "little"))
        digest.update(content)
    return digest.hexdigest()


def _texts_digest(dataset: Any) -> str:
    """files_digest of the texts a dataset holds in its "text" column (UTF-8 decoding and encoding round-trip)."""
    return _text_digest(text for chunk in dataset.data.column("text").chunks for text in chunk.to_pylist())


def _text_files_dataset(source: str, files: Sequence[Path], cache: str | None) -> Any:
    """The files as a disk-backed dataset (one row per file), cached under their content's digest. The cached rows
    are checked against the files before use: an entry holding other text (edited or planted) is removed and the
    files read again."""
    return _checked_text_dataset(
        _files_text,
        {"files": [str(f) for f in files]},
        files_digest(files),
        f"goldfish-text-{CACHE_FORMAT}",
        cache,
        f"background {source!r}: its files changed while they were read. Fix: run again once they are",
    )


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(_HASH_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _local_file_sha256(source: str) -> str | None:
    """The sha256 of a local .jsonl or .parquet source's bytes; None for any other source."""
    path = Path(os.path.expanduser(source))
    return _file_sha256(path) if path.is_file() and path.suffix.lower() in (".jsonl", ".parquet") else None


def _content_identity(source: str, raw: Any) -> dict[str, Any]:
    """What a tokenized cache entry of `raw` is keyed by besides the tokenizer: datasets' fingerprint of the rows (for
    text files: their content digest), and for a local .jsonl or .parquet file the sha256 of its bytes too."""
    return {"rows": str(raw._fingerprint), "file_sha256": _local_file_sha256(source)}


_MANIFEST = "manifest.json"


def _read_entry(entry: Path, key: str) -> Any | None:
    """The tokenized dataset of cache entry `entry`, or None unless its manifest (written last) is there, names
    this key and format, and every Arrow file it lists has the recorded sha256 (and the rows their count)."""
    import datasets

    try:
        manifest = json.loads((entry / _MANIFEST).read_text())
        if manifest.get("format") != CACHE_FORMAT or manifest.get("key") != key or not manifest["files"]:
            return None
        for item in manifest["files"]:
            if _file_sha256(entry / Path(item["name"]).name) != item["sha256"]:
                return None
        parts = [datasets.Dataset.from_file(str(entry / Path(item["name"]).name)) for item in manifest["files"]]
        dataset = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return dataset if len(dataset) == manifest.get("rows") else None


def _write_entry_manifest(entry: Path, key: str, dataset: Any) -> None:
    """Record the sha256 of every Arrow file of a freshly tokenized entry; written last, so its presence says the
    entry is complete."""
    files = [Path(f["filename"]) for f in dataset.cache_files]
    if not files or any(f.parent.resolve() != entry.resolve() for f in files):
        return  # not written into the entry (kept in memory): nothing to reuse
    items = [{"name": f.name, "sha256": _file_sha256(f)} for f in files]
    write_json_atomic(entry / _MANIFEST, {"format": CACHE_FORMAT, "key": key, "rows": len(dataset), "files": items})


def tokenize_corpus(
    source: str,
    tokenizer: Any,
    *,
    text_field: str = "text",
    split: str = "train",
    workers: int = 1,
    cache_dir: str | os.PathLike | None = None,
    progress: bool = True,
) -> TokenizedCorpus:
    """Tokenize a corpus once (batched map over `workers` processes, cached as Arrow) and map it for reading.

    Empty documents are kept with 0 tokens (streams skip them). Raises DataError for a source that cannot be loaded
    or holds no text.
    """
    import datasets

    raw = load_raw_corpus(source, text_field=text_field, split=split, cache_dir=cache_dir)
    bos = getattr(tokenizer, "bos_token_id", None)

    def encode(batch: dict[str, list[str]]) -> dict[str, list[Any]]:
        texts = [t if isinstance(t, str) else "" for t in batch["text"]]
        encoded = tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
        ids = [([bos] if bos is not None else []) + list(e) if e else [] for e in encoded]
        return {
            "ids": ids,
            "n_tokens": [len(i) for i in ids],
            "key": [text_key(t) for t in texts],
            "shingles": [sampled_shingles(t) for t in texts],
        }

    from datasets.fingerprint import Hasher

    identity = {
        "format": CACHE_FORMAT,
        "content": _content_identity(source, raw),
        "tokenizer": Hasher.hash(tokenizer),
        "text_field": text_field,
    }
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode("utf-8")).hexdigest()[:40]
    entry = None if cache_dir is None else Path(cache_dir) / "tokenized" / key
    tokenized = None if entry is None else _read_entry(entry, key)
    if tokenized is None:
        kwargs: dict[str, Any] = {}
        if entry is not None:  # a fresh entry: whatever was there did not pass _read_entry
            shutil.rmtree(entry, ignore_errors=True)
            entry.mkdir(parents=True)
            kwargs["cache_file_name"] = str(entry / "tokens.arrow")
        enabled = datasets.is_progress_bar_enabled()
        if not progress:
            datasets.disable_progress_bar()
        try:
            tokenized = raw.map(
                encode,
                batched=True,
                batch_size=256,
                num_proc=workers if workers > 1 else None,
                remove_columns=["text"],
                desc=f"tokenizing {source}",
                load_from_cache_file=False,  # reuse goes through _read_entry, which checks the files first
                new_fingerprint=key,
                **kwargs,
            )
        finally:
            if enabled and not progress:
                datasets.enable_progress_bar()
        if entry is not None:
            _write_entry_manifest(entry, key, tokenized)
    if len(tokenized) == 0 or not any(tokenized.data.column("n_tokens").to_numpy()):
        raise DataError(
            f"background {source!r} holds no text. Fix: choose the text field with "
            "--background-text-field, or another corpus"
        )
    return TokenizedCorpus(tokenized, source, key)
