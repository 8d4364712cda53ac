"""Memorization evaluation: extraction by greedy decoding, the adaptive attacks, membership inference and the
metrics that score them.

Takes plain inputs (a model, objects with ``.id`` and ``.token_ids``, a decode function); imports nothing
of goldfish/. Result files are written with data.atomic (the project's one atomic writer).

    eval.config       ExtractionConfig and SamplingConfig, the settings (torch-free)
    eval.extraction   greedy extraction and its summary
    eval.adaptive     beam search, sampling and probabilistic extraction
    eval.membership   membership inference attacks
    eval.parallel     the same evaluations on a grid: documents over the data axis, the model over x, y, z
    eval.metrics      the per-document metrics (METRICS describes each)

The names below load on first use (PEP 562), so `import eval.config` costs no torch import: the command line
validates its settings before anything heavy loads.
"""

from __future__ import annotations

import importlib
from typing import Any

_PUBLIC = {
    "ExtractionConfig": "eval.config",
    "METRICS": "eval.metrics",
    "MetricInfo": "eval.metrics",
    "exact_match": "eval.metrics",
    "extract": "eval.extraction",
    "greedy_decode": "eval.decoding",
    "longest_correct_prefix": "eval.metrics",
    "match_fraction": "eval.metrics",
    "metric_info": "eval.metrics",
    "rouge_scores": "eval.metrics",
    "teacher_forced_accuracy": "eval.metrics",
    "write_extraction": "eval.extraction",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'eval' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
