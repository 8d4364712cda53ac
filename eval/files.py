"""The names of the per-document files an evaluation writes, defined once (torch-free).

One JSON-lines file per instrument, one row per document, beside the part's summary.json: `goldfish eval` writes
them under OUT/<part>/, `goldfish compare` under OUT/<model>/eval/<part>/; membership rows cover both parts and sit
one folder up (OUT/membership.jsonl, OUT/<model>/eval/membership.jsonl); the exact-match curve of a compare model
measured during training is OUT/<model>/curve.jsonl. Readers and writers take the names from here, so a file is
renamed in one place.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

EXTRACTION_FILE = "extraction.jsonl"  # greedy extraction: every metric of eval.metrics.METRICS per document
MEMBERSHIP_FILE = "membership.jsonl"  # membership inference scores of the members and non-members
CURVE_FILE = "curve.jsonl"  # compare: greedy extraction of the training documents at each measured epoch

# Instrument (the key of its summary in a part summary, or of its breakdown) -> its per-document rows' file.
# Read-only: the names are data, not state to change at run time.
ROW_FILES: Mapping[str, str] = MappingProxyType(
    {
        "extraction": EXTRACTION_FILE,
        "divergence": "divergence.jsonl",
        "probabilistic": "probabilistic.jsonl",
        "beam": "beam.jsonl",
        "sampling": "sampling.jsonl",
        "prefix_length": "prefix_length.jsonl",
    }
)
