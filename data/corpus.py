"""A background corpus tokenized once into a memory-mapped Arrow cache, read a document at a time.

`tokenize_corpus(source, tokenizer)` loads any source `load_documents` accepts (plus the built-in
"python-stdlib": the Python standard library's own source files) as a `datasets.Dataset` backed by Arrow files on
disk (memory-mapped: reading it does not bring it into memory), and tokenizes it with a batched `map` over
`workers` processes, cached next to the data, so a second run with the same corpus and tokenizer reads the cache.
Each document becomes its ids (bos first when the tokenizer has one, no EOS: the stream adds it), its length, and
a 64-bit key of its normalized text and a sample of its word-shingle hashes (for removing exact and near copies of
target documents, data.dedup.sampled_shingles).

Memory: the corpus holds only its (N,) int64 lengths; `ids(i)` reads one document from the mapped file.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from data.dedup import normalized_text, sampled_shingles
from data.documents import DEFAULT_CORPUS, _is_saved_dataset, _looks_like_path, default_corpus
from data.errors import DataError

PYTHON_STDLIB = "python-stdlib"
# Left out of "python-stdlib": tests, vendored packages, and pydoc_data, which holds the default corpus' text (the
# targets of the embedded corpus study must not be in its background).
_STDLIB_SKIP = frozenset(
    {"test", "tests", "idle_test", "site-packages", "dist-packages", "pydoc_data", "lib2to3", "__pycache__"}
)


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

    def __init__(self, dataset: Any, source: str) -> None:
        self.dataset = dataset
        self.source = source
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
        """The dataset's fingerprint: it changes with the corpus and the tokenizer."""
        return str(self.dataset._fingerprint)


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
        if source == PYTHON_STDLIB:
            files = [str(p) for p in stdlib_files()]
            loaded = datasets.Dataset.from_generator(_files_text, gen_kwargs={"files": files}, cache_dir=cache)
        elif source == DEFAULT_CORPUS:
            loaded = datasets.Dataset.from_dict({"text": [d.text for d in default_corpus()]})
        elif path.is_dir() and _is_saved_dataset(path):
            loaded = datasets.load_from_disk(str(path))
            if isinstance(loaded, datasets.DatasetDict):
                if split not in loaded:
                    raise DataError(
                        f"{path}: has no split {split!r}; available: {sorted(loaded)}. Fix: choose one with --split"
                    )
                loaded = loaded[split]
        elif path.is_dir():
            files = sorted(str(p) for p in path.rglob("*") if p.is_file() and p.suffix.lower() == ".txt")
            if not files:
                raise DataError(
                    f"{path}: folder holds no .txt files. Fix: pass a folder of .txt files, a .jsonl, "
                    f".txt or .parquet file, or {PYTHON_STDLIB!r}"
                )
            loaded = datasets.Dataset.from_generator(_files_text, gen_kwargs={"files": files}, cache_dir=cache)
        elif path.is_file():
            suffix = path.suffix.lower()
            builder = {".jsonl": "json", ".parquet": "parquet"}.get(suffix)
            if suffix == ".txt":
                loaded = datasets.Dataset.from_generator(
                    _files_text, gen_kwargs={"files": [str(path)]}, cache_dir=cache
                )
            elif builder is None:
                raise DataError(
                    f"{path}: unsupported file type {path.suffix!r} for a background corpus. Fix: use a "
                    ".jsonl, .txt or .parquet file, a folder of .txt files or a save_to_disk folder"
                )
            else:
                loaded = datasets.load_dataset(builder, data_files=str(path), split="train", cache_dir=cache)
        elif _looks_like_path(source):
            raise DataError(f"{source}: no such file or folder. Fix: check the --background path")
        else:
            loaded = datasets.load_dataset(source, split=split, cache_dir=cache)
    except DataError:
        raise
    except Exception as error:  # datasets raises many types for unreadable or unreachable data
        raise DataError(
            f"background {source!r} cannot be loaded ({type(error).__name__}: {error}). Fix: pass a local "
            f"file or folder, {PYTHON_STDLIB!r}, or a dataset saved with save_to_disk"
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
        if source == PYTHON_STDLIB:
            files = [str(p) for p in stdlib_files()]
            return datasets.IterableDataset.from_generator(_files_text, gen_kwargs={"files": files})
        if source == DEFAULT_CORPUS:
            return datasets.Dataset.from_dict({"text": [d.text for d in default_corpus()]}).to_iterable_dataset()
        if path.is_dir() and _is_saved_dataset(path):
            return load_raw_corpus(source, split=split).to_iterable_dataset()  # on disk already: read it in order
        if path.is_dir():
            files = sorted(str(p) for p in path.rglob("*") if p.is_file() and p.suffix.lower() == ".txt")
            if not files:
                raise DataError(f"{path}: folder holds no .txt files. Fix: pass a folder of .txt files or a file")
            return datasets.IterableDataset.from_generator(_files_text, gen_kwargs={"files": files})
        if path.is_file():
            suffix = path.suffix.lower()
            if suffix == ".txt":
                return datasets.IterableDataset.from_generator(_files_text, gen_kwargs={"files": [str(path)]})
            builder = {".jsonl": "json", ".parquet": "parquet"}.get(suffix)
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
    tokenizer and budget. `corpus.budget` is the budget; `corpus.n_tokens` what was read (less when the stream
    ended first). Raises DataError for a source that cannot be streamed, lacks the field, or holds no text.
    """
    import datasets

    if isinstance(token_budget, bool) or not isinstance(token_budget, int) or token_budget < 1:
        raise DataError(f"a streamed corpus needs a token budget >= 1, got {token_budget!r}")
    open_stream(source, split=split)  # fail here, with one line, before the cache's generator runs
    enabled = datasets.is_progress_bar_enabled()
    if not progress:
        datasets.disable_progress_bar()
    try:
        tokenized = datasets.Dataset.from_generator(
            _stream_rows,
            gen_kwargs={
                "source": source,
                "split": split,
                "text_field": text_field,
                "tokenizer": tokenizer,
                "token_budget": token_budget,
                "progress": progress,
            },
            cache_dir=None if cache_dir is None else str(cache_dir),
            features=datasets.Features(
                {
                    "ids": datasets.List(datasets.Value("int64")),
                    "n_tokens": datasets.Value("int64"),
                    "key": datasets.Value("int64"),
                    "shingles": datasets.List(datasets.Value("int64")),
                }
            ),
        )
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
    corpus = TokenizedCorpus(tokenized, source)
    corpus.budget = token_budget
    return corpus


def _stream_rows(
    source: str, split: str, text_field: str, tokenizer: Any, token_budget: int, progress: bool, batch: int = 64
) -> Iterator[dict[str, Any]]:
    """Rows of `stream_corpus`: read and tokenize `batch` documents at a time until the budget is met."""
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


def _files_text(files: list[str]) -> Iterator[dict[str, str]]:
    for name in files:
        yield {"text": Path(name).read_text(encoding="utf-8", errors="replace")}


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

    enabled = datasets.is_progress_bar_enabled()
    if not progress:
        datasets.disable_progress_bar()
    try:
        in_memory = not raw.cache_files  # e.g. the default corpus: give map a file of its own to cache to
        kwargs: dict[str, Any] = {}
        if in_memory and cache_dir is not None:
            Path(cache_dir).mkdir(parents=True, exist_ok=True)
            kwargs["cache_file_name"] = str(Path(cache_dir) / f"tokenized-{raw._fingerprint}.arrow")
        tokenized = raw.map(
            encode,
            batched=True,
            batch_size=256,
            num_proc=workers if workers > 1 else None,
            remove_columns=["text"],
            desc=f"tokenizing {source}",
            **kwargs,
        )
    finally:
        if enabled and not progress:
            datasets.enable_progress_bar()
    if len(tokenized) == 0 or not any(tokenized.data.column("n_tokens").to_numpy()):
        raise DataError(
            f"background {source!r} holds no text. Fix: choose the text field with "
            "--background-text-field, or another corpus"
        )
    return TokenizedCorpus(tokenized, source)
