"""How long the near-duplicate search of the document selection takes (data.dedup.find_duplicate_links, mode near).

Two synthetic sets of windows: distinct texts (random words of a 5,000-word vocabulary), and texts that share a
60-word header and differ in their 40-word tails (boilerplate, where every pair shares shingles and the candidate
counts must turn the pairs away). Pure Python, one thread; writes a JSON result with ``--out``.

    python bench/dedup_candidates.py --out bench/results/dedup_candidates.json
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import common

from data.dedup import Candidate, DedupConfig, find_duplicate_links


def timed_links(texts: list[str]) -> tuple[int, float]:
    """(near-duplicate links found, seconds) for windows with these texts."""
    candidates = [Candidate(str(i), text, [i], text) for i, text in enumerate(texts)]
    start = time.perf_counter()
    links = find_duplicate_links(candidates, DedupConfig(mode="near"))
    return sum(link.kind == "near" for link in links), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--distinct", type=int, default=3000, help="windows of the distinct set")
    parser.add_argument("--boilerplate", type=int, default=1500, help="windows of the shared-header set")
    parser.add_argument("--out", type=Path, default=None, help="JSON result file")
    args = parser.parse_args()
    rng = random.Random(0)
    vocabulary = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(6)) for _ in range(5000)]
    words = lambda n: " ".join(rng.choice(vocabulary) for _ in range(n))  # noqa: E731
    header = words(60)
    result = {}
    for name, texts in (
        ("distinct_100_words", [words(100) for _ in range(args.distinct)]),
        ("shared_60_word_header", [header + " " + words(40) for _ in range(args.boilerplate)]),
    ):
        links, seconds = timed_links(texts)
        result[name] = {"windows": len(texts), "near_links": links, "seconds": round(seconds, 2)}
        print(f"{name}: {len(texts)} windows, {links} near links, {seconds:.2f} s")
    if args.out is not None:
        common.write_result(args.out, result)


if __name__ == "__main__":
    main()
