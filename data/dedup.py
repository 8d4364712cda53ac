"""Duplicate and near-duplicate documents, found before the split so that no group of copies straddles it.

A memorization study compares training documents with held-out ones; a held-out document that is a copy of a
training document is extracted because it was trained on, and membership inference counts a member as a
non-member. `find_duplicate_links` finds three kinds of relation between candidate documents:

    exact-text   the same text after normalization (`normalized_text`: Unicode NFKC, lower-cased, punctuation
                 removed, runs of whitespace collapsed), so an upper-cased or re-punctuated copy is a copy;
    same-window  the same selected token window: the seq_len ids that would be trained on and extracted from
                 (texts that differ only after the window are the same document for this run);
    near         the two windows' texts are similar at or above the threshold (`window_similarity`): the word
                 5-gram shingles of the two windows have Jaccard similarity >= threshold (NearDup of Lee et al.
                 2022, "Deduplicating training data makes language models better": MinHash over 5-gram shingles,
                 threshold 0.8), or their word sequences (lower-cased, punctuation dropped), cut to a common
                 length, match at max(threshold, 0.95) (difflib's ratio, 2 * matched words / total words: 0.95
                 is about 5% of the words edited). Each edited word breaks up to 5 shingles, so a copy with 2% of
                 its words edited can fall under a Jaccard of 0.8 while its word sequence still matches 98%.
                 Candidate pairs come from an inverted index of the windows' shingles, searched from each pair's
                 shorter window with counts that every pair meeting either measure on the cut windows passes
                 (`_near_links`), so no such pair is missed; each candidate is confirmed with the exact measures,
                 and the larger of the two is the similarity recorded.

Near-duplicates are judged on the window's text because only the window is trained on or extracted; text beyond
it cannot leak into a run. Links are merged into clusters by union-find (the connected components of the links,
as Lee et al. do), and `data.selection` places each whole cluster on one side of the split.

`ngram_containment` is the audit figure recorded beside the split: the largest fraction of a held-out window's
word 8-grams that occur in training windows (the n-gram overlap used to measure benchmark contamination, e.g.
8-grams in Chowdhery et al. 2022, PaLM, section 8).

Imports nothing of the other project packages.
"""

from __future__ import annotations

import difflib
import hashlib
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from data.errors import DataError

DedupMode = Literal["off", "exact", "near"]  # --dedup: no deduplication, exact text only, or near-duplicates too
DuplicatePolicy = Literal["drop", "repeat"]  # --duplicates: a training duplicate dropped, or kept as a counted repeat
DEDUP_MODES: tuple[DedupMode, ...] = get_args(DedupMode)
DUPLICATE_POLICIES: tuple[DuplicatePolicy, ...] = get_args(DuplicatePolicy)
DEFAULT_THRESHOLD = 0.8  # Jaccard of word 5-gram shingles (Lee et al. 2022)
SHINGLE_WORDS = 5
AUDIT_NGRAM = 8
EDIT_RATIO = 0.95  # word-sequence match (difflib ratio) at or above which a window is a near-duplicate
KIND_RANK = {"exact-text": 0, "same-window": 1, "near": 2}  # strongest first

# A word: a run of letters/digits/underscore in any script; each CJK ideograph, kana or hangul syllable is a word
# of its own (those scripts do not separate words by spaces, so \w+ would make a whole sentence one "word").
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_WORD = re.compile(rf"[{_CJK}]|[^\W{_CJK}]+", re.UNICODE)


@dataclass(frozen=True)
class DedupConfig:
    """How duplicates are found and what becomes of the extra copies.

    mode: "off" (no check), "exact" (exact-text and same-window), "near" (both exact kinds and
        near-duplicates of the windows).
    threshold: Jaccard similarity of word 5-gram shingles at or above which two windows are near-duplicates
        (0 < threshold <= 1; used by mode "near").
    duplicates: "drop" removes the extra copies of a training document; "repeat" keeps them in training as
        counted repeats (a study of duplication). Copies of a held-out document are always dropped.
    """

    mode: DedupMode = "near"
    threshold: float = DEFAULT_THRESHOLD
    duplicates: DuplicatePolicy = "drop"

    def __post_init__(self) -> None:
        if self.mode not in DEDUP_MODES:
            raise DataError(f"dedup mode {self.mode!r} is unknown. Fix: use --dedup {'|'.join(DEDUP_MODES)}.")
        if (
            isinstance(self.threshold, bool)
            or not isinstance(self.threshold, (int, float))
            or not (0.0 < float(self.threshold) <= 1.0)
        ):
            raise DataError(
                f"dedup threshold must be a number in (0, 1], got {self.threshold!r}. "
                "Fix: use e.g. --dedup-threshold 0.8."
            )
        if self.duplicates not in DUPLICATE_POLICIES:
            raise DataError(
                f"duplicates policy {self.duplicates!r} is unknown. "
                f"Fix: use --duplicates {'|'.join(DUPLICATE_POLICIES)}."
            )

    def record(self) -> dict[str, Any]:
        """A JSON-able description for run records."""
        entry: dict[str, Any] = {"mode": self.mode, "duplicates": self.duplicates}
        if self.mode != "off":
            entry["kinds"] = ["exact-text", "same-window"] + (["near"] if self.mode == "near" else [])
            entry["normalization"] = (
                "texts compared after Unicode NFKC, lower-casing, punctuation removed and whitespace collapsed"
            )
        if self.mode == "near":
            entry.update(
                threshold=float(self.threshold),
                similarity="Jaccard of word 5-gram shingles >= threshold, "
                f"or difflib's word-sequence ratio >= max(threshold, {EDIT_RATIO}), of the selected "
                "windows' texts (lower-cased, punctuation dropped, cut to a common length); the larger "
                "measure is recorded",
                candidates="every pair meeting either measure (an inverted index of the windows' shingles, searched "
                "from the shorter window), confirmed with the exact similarity",
            )
        return entry


@dataclass(frozen=True)
class Candidate:
    """A long-enough document as deduplication sees it.

    text: the full text. token_ids: the selected window (seq_len ids). window_text: the window's ids decoded
    to text (what near-duplicates are judged on).
    """

    id: str
    text: str
    token_ids: Sequence[int]
    window_text: str


@dataclass(frozen=True)
class Link:
    """Candidates a and b (indices into the candidate list) are duplicates of the given kind.

    similarity: 1.0 for the exact kinds; for "near" the larger of the shingle Jaccard and the word-sequence ratio.
    """

    a: int
    b: int
    kind: str
    similarity: float


def normalized_text(text: str) -> str:
    """The text as duplicates are compared: Unicode NFKC (full-width and compatibility forms folded), lower-cased,
    every punctuation character (Unicode category P*) turned into a space, every run of whitespace one space, the
    ends stripped. "Hello,  World!" and "HELLO world" normalize alike."""
    folded = unicodedata.normalize("NFKC", text).lower()
    return " ".join("".join(" " if unicodedata.category(ch).startswith("P") else ch for ch in folded).split())


_SAFE_CUT = re.compile(r"[ \t\n\r]")  # ASCII whitespace: a boundary for NFKC, lower() (final sigma) and words
NORMALIZE_CHUNK_CHARS = 1 << 20


def normalized_digest(text: str, chunk_chars: int = NORMALIZE_CHUNK_CHARS) -> str:
    """sha256 (hex) of `normalized_text(text)`, computed over pieces of about `chunk_chars` characters cut just
    before ASCII whitespace, so a 50 MB document costs a few of its pieces in memory rather than a list of its
    characters. Equal to the digest of the whole normalized text: no NFKC composition, case mapping or word
    reaches across such a cut, and normalized pieces joined by one space are the normalized whole."""
    digest = hashlib.sha256()
    start, wrote = 0, False
    while start < len(text):
        found = _SAFE_CUT.search(text, start + chunk_chars) if start + chunk_chars < len(text) else None
        end = found.start() if found else len(text)
        piece = normalized_text(text[start:end])
        if piece:
            digest.update(((" " if wrote else "") + piece).encode("utf-8"))
            wrote = True
        start = end
    return digest.hexdigest()


def words(text: str) -> list[str]:
    """Lower-cased words of any script (CJK characters one word each)."""
    return _WORD.findall(text.lower())


def shingles(text: str, n: int = SHINGLE_WORDS) -> frozenset[str]:
    """The set of n-word shingles of `text` (one shingle of all its words when it has fewer than n)."""
    tokens = words(text)
    if len(tokens) < n:
        return frozenset([" ".join(tokens)]) if tokens else frozenset()
    return frozenset(" ".join(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


CONTAINMENT_SAMPLE = 4  # a background document keeps the hashes of 1 in 4 of its shingles (see sampled_shingles)
CONTAINMENT_THRESHOLD = 0.5  # a background document holding half of a target's shingles trains on that target


def sampled_shingles(text: str, n: int = SHINGLE_WORDS, modulus: int = CONTAINMENT_SAMPLE) -> list[int]:
    """Sorted unique 63-bit hashes of the word n-gram shingles of `normalized_text(text)`, keeping only the hashes
    that are 0 mod `modulus`.

    Keeping a hash by its value (Broder 1997, "On the resemblance and containment of documents": the mod-m sample)
    keeps the same shingles in every text that has them, so the fraction of a target's sample found in a
    document's sample estimates the fraction of the target's shingles the document contains, at 1/modulus of the
    storage of all shingles. A text with fewer than n words is one shingle of all its words.
    """
    tokens = words(normalized_text(text))
    if not tokens:
        return []
    grams = [" ".join(tokens)] if len(tokens) < n else [" ".join(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    hashes = {int.from_bytes(hashlib.blake2b(g.encode("utf-8"), digest_size=8).digest(), "little") >> 1 for g in grams}
    return sorted(h for h in hashes if h % modulus == 0)


def sample_containment(
    documents: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], threshold: float = CONTAINMENT_THRESHOLD
) -> list[tuple[int, int, float]]:
    """In memory, what data.corpus.TokenizedCorpus.containing does on a mapped corpus: (document, target,
    containment) for every pair where the fraction of target t's sampled shingle hashes (`sampled_shingles`) found
    in document d's is >= threshold, sorted. Targets with an empty sample are never matched."""
    owners: dict[int, list[int]] = {}
    for target, sample in enumerate(targets):
        for value in set(sample):
            owners.setdefault(value, []).append(target)
    sizes = [len(set(sample)) for sample in targets]
    found = []
    for document, sample in enumerate(documents):
        hits = Counter(target for value in set(sample) for target in owners.get(value, ()))
        found += [(document, t, n / sizes[t]) for t, n in hits.items() if n / sizes[t] >= threshold]
    return sorted(found)


def without_copies(texts: Sequence[str], targets: Sequence[str]) -> tuple[list[str], int]:
    """(`texts` without those that copy a target, how many were left out), by the rule a background stream removes
    copies of targets with: the same normalized text, or holding >= CONTAINMENT_THRESHOLD of a target's sampled word
    shingles (an edited copy, or the target inside a longer text)."""
    keys = {normalized_digest(t) for t in targets}
    near = sample_containment([sampled_shingles(t) for t in texts], [sampled_shingles(t) for t in targets])
    copies = {document for document, _, _ in near} | {i for i, t in enumerate(texts) if normalized_digest(t) in keys}
    return [t for i, t in enumerate(texts) if i not in copies], len(copies)


def window_similarity(a: str, b: str, n: int = SHINGLE_WORDS) -> tuple[float, float]:
    """How alike two window texts are: (Jaccard of their word n-gram shingles, difflib's matching ratio of their
    word sequences), both over the words (`words`: lower-cased, punctuation dropped) cut to the shorter text's
    length (two windows of the same number of tokens can end a few words apart). (0.0, 0.0) when either has no
    word."""
    wa, wb = words(a), words(b)
    if not wa or not wb:
        return 0.0, 0.0
    length = min(len(wa), len(wb))
    wa, wb = wa[:length], wb[:length]
    sequence = difflib.SequenceMatcher(None, wa, wb, autojunk=False).ratio()
    return jaccard(shingles(" ".join(wa), n), shingles(" ".join(wb), n)), sequence


def is_near_duplicate(a: str, b: str, threshold: float) -> tuple[bool, float]:
    """(whether two window texts are near-duplicates at `threshold`, the similarity recorded): shingle Jaccard >=
    threshold or word-sequence ratio >= max(threshold, EDIT_RATIO); the similarity is the larger measure."""
    shingle_jaccard, sequence = window_similarity(a, b)
    near = shingle_jaccard >= threshold or sequence >= max(threshold, EDIT_RATIO)
    return near, max(shingle_jaccard, sequence)


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    """|a & b| / |a | b| (0.0 for two empty sets)."""
    union = len(a | b)
    return len(a & b) / union if union else 0.0


def _digest(value: str | Sequence[int]) -> str:
    data = value.encode("utf-8") if isinstance(value, str) else ",".join(map(str, value)).encode("ascii")
    return hashlib.sha256(data).hexdigest()


def find_duplicate_links(candidates: Sequence[Candidate], config: DedupConfig) -> list[Link]:
    """Every duplicate relation between `candidates` that `config.mode` asks for.

    Exact kinds link each member of a group with equal keys to the group's first member (that is enough for
    union-find); near links are all confirmed pairs, each pair once (the smaller index first). A pair that is an
    exact duplicate gets only its exact link.
    """
    if config.mode == "off":
        return []
    links: list[Link] = []
    exact_pairs: set[tuple[int, int]] = set()
    for kind, key in (
        ("exact-text", lambda c: normalized_digest(c.text)),
        ("same-window", lambda c: _digest([int(t) for t in c.token_ids])),
    ):
        first: dict[str, int] = {}
        for i, candidate in enumerate(candidates):
            j = first.setdefault(key(candidate), i)
            if j != i and (j, i) not in exact_pairs:
                links.append(Link(j, i, kind, 1.0))
                exact_pairs.add((j, i))
    if config.mode == "near":
        links.extend(_near_links(candidates, config.threshold, exact_pairs))
    return links


def _near_links(candidates: Sequence[Candidate], threshold: float, skip: set[tuple[int, int]]) -> list[Link]:
    """Every pair of windows that `is_near_duplicate` accepts, found without comparing every pair.

    The rule cuts both windows to the shorter one's L words, so a pair is searched for from its shorter window a
    (la <= lb) against the other window b whole (a superset of what the rule compares). Necessary conditions:

    * Jaccard >= t on the cut windows: at least t |S(a)| of a's shingles S(a) are in S(b);
    * word-sequence ratio M / L >= r (M matched words): at most floor((1 - r) L) unmatched words on each side, so
      (1) at least ceil(r L) of a's L words occur in b (matched words pair equal words), and (2) of a's floor(L / 5)
      disjoint 5-word chunks at least floor(L / 5) - 2 floor((1 - r) L) are in S(b): a chunk not inside one of
      difflib's matching blocks holds an unmatched word of a or a block boundary, and each boundary has an
      unmatched word of b (difflib merges blocks adjacent on both sides).

    At least c of n items in b means any n - c + 1 of them include one in b (pigeonhole), so only a's rarest
    n - c + 1 shingles, words and chunks are looked up in inverted indexes of every window (prefix filtering,
    Bayardo et al. 2007, "Scaling up all pairs similarity search"); a sequence candidate must be found by both its
    words and its chunks. Each candidate then passes the full counts (the words counted with multiplicity on the
    cut windows) before the exact rule confirms it. A window of fewer than 5 words is near only to a window whose
    first words are the same words, looked up by those words.
    """
    sequences = [words(c.window_text) for c in candidates]
    grams = [[" ".join(ws[k : k + SHINGLE_WORDS]) for k in range(len(ws) - SHINGLE_WORDS + 1)] for ws in sequences]
    sets = [frozenset(g) for g in grams]
    counts = [Counter(ws) for ws in sequences]
    by_shingle: dict[str, set[int]] = {}
    by_word: dict[str, set[int]] = {}
    by_start: dict[tuple[str, ...], set[int]] = {}  # the first n < 5 words
    for i, ws in enumerate(sequences):
        for key in sets[i]:
            by_shingle.setdefault(key, set()).add(i)
        for word in counts[i]:
            by_word.setdefault(word, set()).add(i)
        for n in range(1, min(len(ws) + 1, SHINGLE_WORDS)):
            by_start.setdefault(tuple(ws[:n]), set()).add(i)

    def holders(index: dict[str, set[int]], keys: Sequence[str], need: int) -> set[int]:
        """The windows holding one of the len(keys) - need + 1 rarest keys."""
        rarest = sorted(keys, key=lambda k: (len(index[k]), k))[: len(keys) - need + 1]
        return set().union(*(index[k] for k in rarest))

    ratio = max(float(threshold), EDIT_RATIO)
    compared: set[tuple[int, int]] = set(skip)
    links: list[Link] = []
    for a, ws in enumerate(sequences):
        length = len(ws)
        if length == 0:
            continue
        if length < SHINGLE_WORDS:
            partners = by_start.get(tuple(ws), set())  # the lookup is the whole condition
        else:
            chunks = grams[a][::SHINGLE_WORDS]
            need_shared = math.ceil(threshold * len(sets[a]) - 1e-9)
            need_words = math.ceil(ratio * length - 1e-9)
            need_chunks = len(chunks) - 2 * math.floor((1 - ratio) * length + 1e-9)  # >= 1 for r >= 0.95
            partners = holders(by_shingle, list(sets[a]), need_shared) | (
                holders(by_word, ws, need_words) & holders(by_shingle, chunks, need_chunks)
            )
        for b in sorted(partners):
            pair = (min(a, b), max(a, b))
            if b == a or len(sequences[b]) < length or pair in compared:
                continue
            if length >= SHINGLE_WORDS and len(sets[a] & sets[b]) < need_shared:
                cut = counts[b] if len(sequences[b]) == length else Counter(sequences[b][:length])
                shared_words = sum(min(n, cut[word]) for word, n in counts[a].items())
                if shared_words < need_words or sum(chunk in sets[b] for chunk in chunks) < need_chunks:
                    continue  # neither measure can reach its threshold
            compared.add(pair)
            first, second = candidates[pair[0]].window_text, candidates[pair[1]].window_text
            near, similarity = is_near_duplicate(first, second, threshold)  # earlier window first, as documented
            if near:
                links.append(Link(pair[0], pair[1], "near", similarity))
    return sorted(links, key=lambda link: (link.b, link.a))


def cluster_roots(n: int, links: Iterable[Link]) -> list[int]:
    """Union-find over n items: each item's cluster root, the cluster's smallest index (its earliest member)."""
    parent = list(range(n))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]  # path halving
            i = parent[i]
        return i

    for link in links:
        a, b = find(link.a), find(link.b)
        if a != b:
            parent[max(a, b)] = min(a, b)
    return [find(i) for i in range(n)]


def best_links(n: int, links: Iterable[Link]) -> list[Link | None]:
    """For each item, its strongest link (exact-text > same-window > near, then higher similarity, then the
    earlier partner), or None when it has none: what a removal record names as the reason."""
    best: list[Link | None] = [None] * n

    def strength(link: Link, me: int) -> tuple[int, float, int]:
        other = link.b if link.a == me else link.a
        return (-KIND_RANK[link.kind], link.similarity, -other)

    for link in links:
        for me in (link.a, link.b):
            if best[me] is None or strength(link, me) > strength(best[me], me):
                best[me] = link
    return best


def ngram_containment(heldout_texts: Sequence[str], train_texts: Sequence[str], n: int = AUDIT_NGRAM) -> list[float]:
    """For each held-out text, the fraction of its word n-grams that occur in any training text (0..1; 0.0 for a
    text with no n-gram)."""
    seen: set[str] = set()
    for text in train_texts:
        seen |= shingles(text, n)
    result = []
    for text in heldout_texts:
        own = shingles(text, n)
        result.append(len(own & seen) / len(own) if own else 0.0)
    return result
