"""Typed results (goldfish.app.results) serialize to exactly the dicts summary.json has held, and the names of
metrics and per-document files are each defined in one module."""

from __future__ import annotations

import ast
import dataclasses
import json
import typing
from collections import defaultdict
from pathlib import Path

import pytest

from eval.files import CURVE_FILE, MEMBERSHIP_FILE, ROW_FILES
from eval.metrics import HEADLINE_METRICS, INTERVAL_METRICS, METRICS
from goldfish.app.bucket_section import BucketMembership, BucketStats, ModelBuckets
from goldfish.app.compare_result import CompareResult
from goldfish.app.eval_result import EvalResult
from goldfish.app.matched_section import LossMatched, MatchedControls, MatchedRow
from goldfish.app.results import HEADLINE_KEYS, ModelResult, PartResult
from goldfish.app.seeds_result import SeedsResult

ROOT = Path(__file__).resolve().parents[2]
SOURCE_FOLDERS = ("goldfish", "eval", "data", "engine", "bench")
QUICKSTART = ROOT / "bench" / "results" / "compare_quickstart" / "summary.json"
CORPUS_SEED = ROOT / "bench" / "results" / "compare_corpus" / "seed-0" / "summary.json"


def _modules() -> list[Path]:
    return sorted(p for folder in SOURCE_FOLDERS for p in (ROOT / folder).rglob("*.py"))


def test_part_results_serialize_to_todays_part_summaries_in_their_order() -> None:
    for path in (QUICKSTART, CORPUS_SEED):
        summary = json.loads(path.read_text())
        for label, parts in summary["details"].items():
            for part, today in parts.items():
                typed = PartResult.from_summary(today)
                assert typed.to_json() == today and list(typed.to_json()) == list(today), (path, label, part)
                # the headline entry of summary.json's "models" is the typed part's headline (which has every key
                # of today's, and those of metrics added since, e.g. suffix_tf_accuracy, as None: not in the file)
                headline = summary["models"][label][part]
                assert {k: typed.headline()[k] for k in headline} == headline
                assert list(headline) == [k for k in HEADLINE_KEYS if k in headline]


def test_compare_results_read_back_write_every_shipped_summary_byte_for_byte() -> None:
    shipped = sorted((ROOT / "bench" / "results").rglob("summary.json"))
    compared = [path for path in shipped if "per_seed" not in json.loads(path.read_text())]  # not --seeds combinations
    assert len(compared) >= 10
    for path in compared:
        text = json.dumps(json.loads(path.read_text()), indent=2)
        typed = CompareResult.from_json(json.loads(path.read_text()))
        assert json.dumps(typed.to_json(), indent=2) == text, path
    older = json.loads(QUICKSTART.read_text())
    del older["warnings"], older["details"]  # an older file: written back without them, parts from the headlines
    typed = CompareResult.from_json(older)
    assert typed.to_json() == older and typed.parts("standard")["train"].metrics["exact_match"] is not None
    combined = json.loads((ROOT / "bench" / "results" / "compare_corpus" / "summary.json").read_text())
    with pytest.raises(ValueError, match="not a compare summary"):
        CompareResult.from_json(combined)


def test_model_result_is_the_eval_summary_shape() -> None:
    details = json.loads(QUICKSTART.read_text())
    parts = details["details"]["standard"]
    membership = details["membership"]["standard"]
    typed = ModelResult({name: PartResult.from_summary(s) for name, s in parts.items()}, membership, [{"id": "x"}])
    assert typed.to_json() == parts | {"membership": membership}
    for part in parts:
        today = details["models"]["standard"][part]
        assert {k: typed.headline()[part][k] for k in today} == today
    assert typed.rows("extraction") == []  # rows live in memory only
    assert ModelResult({"train": typed.parts["train"]}).to_json() == {"train": parts["train"]}


def test_eval_result_writes_the_eval_summary_in_its_order() -> None:
    shipped = json.loads(QUICKSTART.read_text())
    summary = shipped["details"]["standard"] | {
        "membership": shipped["membership"]["standard"],
        "documents": shipped["documents"],
        "checkpoint": {"step": 12, "exposures": {"a": 3}},
        "grid": {"data": 2, "x": 1},
    }
    typed = EvalResult.from_json(summary)
    assert list(typed.parts) == ["train", "heldout"] and typed.membership == summary["membership"]
    assert json.dumps(typed.to_json(), indent=2) == json.dumps(summary, indent=2)
    bare = {"heldout": shipped["details"]["standard"]["heldout"]}  # --part heldout, no record: no checkpoint
    assert json.dumps(EvalResult.from_json(bare).to_json()) == json.dumps(bare)
    built = EvalResult(typed.model, documents=summary["documents"], grid={"data": 2, "x": 1})
    assert list(built.to_json()) == ["train", "heldout", "membership", "documents", "grid"]


def test_headline_keys_come_from_the_metric_registry() -> None:
    assert set(HEADLINE_METRICS) <= set(METRICS) and set(INTERVAL_METRICS) <= set(HEADLINE_METRICS)
    assert HEADLINE_KEYS[0] == "n_docs"
    assert [k for k in HEADLINE_KEYS if k.endswith("_ci")] == [f"{m}_ci" for m in INTERVAL_METRICS]
    assert all(METRICS[m].header for m in HEADLINE_METRICS)  # every headline column has its header


def test_every_per_document_file_name_is_spelled_in_one_module() -> None:
    names = {*ROW_FILES.values(), MEMBERSHIP_FILE, CURVE_FILE}
    spelled: dict[str, set[str]] = defaultdict(set)
    for module in _modules():
        for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in names:
                spelled[node.value].add(str(module.relative_to(ROOT)))
    assert dict(spelled) == {name: {"eval/files.py"} for name in names}


def _metric_key(node: ast.expr) -> str | None:
    """The metric key an expression names: a key's string, or eval.metrics' constant for it (EXACT_MATCH...)."""
    if isinstance(node, ast.Constant) and node.value in METRICS:
        return node.value
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name.lower() if name.isupper() and name.lower() in METRICS else None


def test_no_list_of_metric_keys_is_spelled_twice() -> None:
    """A tuple, list or set literal naming two or more registered metrics is a list of metric keys: each such list
    is written in one place (e.g. INTERVAL_METRICS), and every other module uses that name."""
    lists: dict[frozenset[str], set[str]] = defaultdict(set)
    for module in _modules():
        for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                keys = frozenset(key for key in map(_metric_key, node.elts) if key is not None)
                if len(keys) >= 2:
                    lists[keys].add(f"{module.relative_to(ROOT)}:{node.lineno}")
    assert lists, "the registry's own lists are found"
    assert {sorted(keys)[0]: places for keys, places in lists.items() if len(places) > 1} == {}


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of a module and of its classes and functions (prose, which may name keys)."""
    owners = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, owners)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def _lazy_exports(tree: ast.AST) -> set[int]:
    """The ids of the name strings of eval/__init__.py's lazy-export table `_PUBLIC`: attribute names of the package's
    functions (e.g. eval.metrics.exact_match, named like the metric it computes), not metric keys."""
    return {
        id(key)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "_PUBLIC" for t in node.targets)
        and isinstance(node.value, ast.Dict)
        for key in node.value.keys
    }


# Keys made of a metric key and a suffix (its interval, a bucket's count, the seeds' pooled and per-seed values).
DERIVED_SUFFIXES = ("_ci", "_k", "_pooled", "_per_seed")


def test_every_metric_key_is_spelled_in_one_module() -> None:
    """Code spells a metric key (as a string or as a keyword argument) in eval/metrics.py only; every other module
    reads its name there (EXACT_MATCH, ROUGE_L, ...), and builds the keys derived from it from that name
    (interval_key(EXACT_MATCH), f"{EXACT_MATCH}_per_seed"). Docstrings and comments may name keys in prose."""
    import eval as eval_package
    import eval.metrics as metrics

    derived = {key + suffix for key in METRICS for suffix in DERIVED_SUFFIXES} - set(METRICS)
    # an f-string's literal parts count too: f"{side}_exact_match_k" has the part "_exact_match_k"
    spellings = {name: name for name in {*METRICS, *derived}} | {f"_{name}": name for name in {*METRICS, *derived}}
    spelled: dict[str, set[str]] = defaultdict(set)
    for module in _modules():
        tree = ast.parse(module.read_text(encoding="utf-8"))
        where = str(module.relative_to(ROOT))
        skip = _docstrings(tree) | (_lazy_exports(tree) if where == "eval/__init__.py" else set())
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in spellings and id(node) not in skip:
                spelled[spellings[node.value]].add(f"{where}:{node.lineno}")
            if isinstance(node, ast.keyword) and node.arg in spellings:
                spelled[spellings[node.arg]].add(f"{where}:{node.value.lineno}")
    outside = {
        key: sorted(place for place in places if not place.startswith("eval/metrics.py:"))
        for key, places in spelled.items()
    }
    assert {key: places for key, places in outside.items() if places} == {}
    # each key is spelled once, as the value of its named constant, which the registry uses
    assert {key: len(places) for key, places in spelled.items()} == {key: 1 for key in METRICS}
    assert all(getattr(metrics, key.upper()) == key for key in METRICS)
    # the exempted lazy exports are functions of eval.metrics
    exported = [name for name in eval_package.__all__ if name in METRICS]
    assert exported and all(callable(getattr(metrics, name)) for name in exported)


def test_instrument_summary_keys_are_spelled_in_one_module() -> None:
    """The keys of a membership attack's summary and of sampling extraction's (AUC, TPR_AT_FPR, ANY_EXACT, ...) are
    spelled in eval/metrics.py only: the instruments that write them and the reports that read them use its names.
    (bench/ scripts keep keys of their own outputs.)"""
    import eval.metrics as metrics

    keys = {metrics.AUC, metrics.AUC_CI, metrics.TPR_AT_FPR, metrics.TPR_AT_FPR_CI, metrics.ANY_EXACT}
    spelled = []
    for module in _modules():
        where = str(module.relative_to(ROOT))
        if where.startswith("bench/"):
            continue
        tree = ast.parse(module.read_text(encoding="utf-8"))
        skip = _docstrings(tree)
        spelled += [
            f"{where}:{node.lineno}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and node.value in keys and id(node) not in skip
        ]
    assert sorted(place.split(":")[0] for place in spelled) == ["eval/metrics.py"] * len(keys)


# The result types the reports are rendered from; each is walked with every dataclass its fields name.
RESULT_TYPES = (
    PartResult,
    ModelResult,
    CompareResult,
    SeedsResult,
    EvalResult,
    ModelBuckets,
    BucketStats,
    BucketMembership,
    MatchedControls,
    MatchedRow,
    LossMatched,
)


def _any_fields(cls: type, seen: set[type] | None = None) -> list[str]:
    """The fields of a dataclass, and of every dataclass its fields' types name (in unions, lists, dicts, ...), whose
    type is or contains Any: "Class.field" for each."""
    seen = set() if seen is None else seen
    if cls in seen:
        return []
    seen.add(cls)
    found = []
    for name, hint in typing.get_type_hints(cls).items():
        stack = [hint]
        while stack:
            part = stack.pop()
            if part is typing.Any:
                found.append(f"{cls.__name__}.{name}")
            elif dataclasses.is_dataclass(part) and isinstance(part, type):
                found += _any_fields(part, seen)
            else:  # a JsonValue's self-reference stays a ForwardRef: nothing more to walk there
                stack.extend(typing.get_args(part))
    return found


def test_result_types_hold_no_any() -> None:
    assert [cls for cls in RESULT_TYPES if dataclasses.is_dataclass(cls)] == list(RESULT_TYPES)
    assert [field for cls in RESULT_TYPES for field in _any_fields(cls)] == []
    # compare's sections are typed down to their leaves: no free-form JSON left in the buckets and matched controls
    hints = typing.get_type_hints(CompareResult)
    assert hints["buckets"] == dict[str, ModelBuckets] | None
    assert hints["matched_controls"] == MatchedControls | None


@dataclasses.dataclass
class _Inner:
    values: dict[str, list[typing.Any] | None]


@dataclasses.dataclass
class _Outer:
    inner: list[_Inner] | None
    fine: dict[str, int]


def test_the_walk_finds_any_inside_nested_dataclasses_and_containers() -> None:
    assert _any_fields(_Outer) == ["_Inner.values"]
