"""Memorization evaluation: extraction by greedy decoding and the metrics that score it.

Takes plain inputs (a model, objects with ``.id`` and ``.token_ids``, a decode function); imports nothing
of goldfish/. Result files are written with data.atomic (the project's one atomic writer).
"""

from eval.decoding import greedy_decode
from eval.extraction import ExtractionConfig, extract, write_extraction
from eval.metrics import (
    METRICS,
    MetricInfo,
    exact_match,
    longest_correct_prefix,
    match_fraction,
    metric_info,
    rouge_scores,
    teacher_forced_accuracy,
)

__all__ = [
    "ExtractionConfig",
    "METRICS",
    "MetricInfo",
    "exact_match",
    "extract",
    "greedy_decode",
    "longest_correct_prefix",
    "match_fraction",
    "metric_info",
    "rouge_scores",
    "teacher_forced_accuracy",
    "write_extraction",
]
