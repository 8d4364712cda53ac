"""Results broken down by a per-document attribute: prefix length, or how many times a document was repeated.

Rows are the per-document dicts the extraction instruments write; a breakdown groups them by the value of one key
and averages chosen metrics within each group.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from eval.extraction import ExtractionConfig, extract


def tag_rows(
    rows: Sequence[dict[str, Any]], key: str, values: Mapping[str, Any], default: Any = None
) -> list[dict[str, Any]]:
    """Copies of ``rows`` with ``row[key] = values[row["id"]]`` (``default`` for ids not in ``values``).

    E.g. key="repeats" with {document id: times it was repeated in training}.
    """
    return [dict(row, **{key: values.get(str(row["id"]), default)}) for row in rows]


def group_means(rows: Sequence[Mapping[str, Any]], key: str, metrics: Sequence[str]) -> list[dict[str, Any]]:
    """One entry per distinct value of ``row[key]``, sorted by that value: {key: value, "n_docs": count, and the
    mean of each metric over the group's rows}. Booleans average as 0/1 (exact match -> fraction extracted);
    None values are left out of a mean (a mean with nothing to average is None). Rows without ``key`` fail.
    """
    groups: dict[Any, list[Mapping[str, Any]]] = {}
    for i, row in enumerate(rows):
        if key not in row:
            raise ValueError(f"row {i} (id {row.get('id')!r}) has no {key!r} field to group by; tag the rows first")
        groups.setdefault(row[key], []).append(row)
    table = []
    for value in sorted(groups, key=lambda v: (v is None, v)):
        members = groups[value]
        entry: dict[str, Any] = {key: value, "n_docs": len(members)}
        for metric in metrics:
            present = [float(r[metric]) for r in members if r.get(metric) is not None]
            entry[metric] = sum(present) / len(present) if present else None
        table.append(entry)
    return table


def extract_by_prefix_length(
    model: Any,
    documents: Sequence[Any],
    prefix_lengths: Sequence[int],
    *,
    suffix_len: int = 50,
    batch_size: int = 32,
    decode: Callable[[list[int]], str],
    pad_token_id: int,
    progress: bool = False,
) -> list[dict[str, Any]]:
    """Greedy extraction of the same documents with several fixed prefix lengths (Carlini et al. 2022's
    "k-extractable" protocol: a ``suffix_len``-token suffix right after the first P tokens).

    Returns the rows of ``eval.extraction.extract`` for every P, each tagged with ``prefix_len`` = P; group them
    with ``group_means(rows, "prefix_len", [...])``. Documents shorter than P + suffix_len are skipped for that P.
    """
    rows: list[dict[str, Any]] = []
    for prefix_len in prefix_lengths:
        config = ExtractionConfig(suffix_len=suffix_len, prefix_len=int(prefix_len), batch_size=batch_size)
        part, _ = extract(model, documents, config, decode=decode, pad_token_id=pad_token_id, progress=progress)
        rows.extend(dict(row, prefix_len=int(prefix_len)) for row in part)
    return rows
