"""What `goldfish compare` prints on the console: one line per model as it finishes, and the headline table at the end.

The table's columns are the README's quick-start table's (README.md, "Result"), so the printed table and the
README's read the same: exact match and RougeL on the training and held-out documents, teacher-forced accuracy on the
training documents' kept vs dropped targets (eval.audit's split, by each model's own goldfish mask; standard and
control models by the first goldfish mask), and the held-out loss in nats per token.
"""

from __future__ import annotations

from typing import Any, Mapping

from eval.metrics import EXACT_MATCH, ROUGE_L, TF_DROPPED_ACCURACY, TF_KEPT_ACCURACY
from goldfish.app.compare_result import CompareResult

# (header, width) per column of the printed table; the headers are the README table's, in its order.
TABLE_COLUMNS: tuple[tuple[str, int], ...] = (
    ("model", 34),
    ("train exact match", 17),
    ("train RougeL", 12),
    ("held-out exact match", 20),
    ("held-out RougeL", 15),
    ("TF accuracy kept / dropped", 26),
    ("held-out loss", 13),
)
COLUMN_GAP = "  "  # two spaces between columns: a header holds single spaces, so a reader splits on two


def one_line(label: str, parts: Mapping[str, Any]) -> str:
    """The line logged when a model's evaluation finishes: exact match and RougeL on both parts."""
    train, held = parts["train"], parts["heldout"]
    return (
        f"{label}: train exact match {train[EXACT_MATCH]:.3f} RougeL {train[ROUGE_L]:.3f} | "
        f"held-out exact match {held[EXACT_MATCH]:.3f} RougeL {held[ROUGE_L]:.3f}"
    )


def _fmt(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def format_table(result: CompareResult) -> str:
    """A plain-text table of the headline metrics per model (result.headlines: label -> part -> metrics), with the
    README's columns; a value a summary lacks (an older one, or no held-out loss) prints as n/a."""
    widths = [width for _, width in TABLE_COLUMNS]

    def row(cells: list[str]) -> str:
        first, *rest = cells
        return COLUMN_GAP.join([f"{first:<{widths[0]}}", *(f"{c:>{w}}" for c, w in zip(rest, widths[1:]))]).rstrip()

    header = row([name for name, _ in TABLE_COLUMNS])
    lines = [header, "-" * len(header)]
    for label, parts in result.headlines.items():
        train, held = parts["train"], parts["heldout"]
        loss = (parts.get("heldout_loss") or {}).get("loss")
        kept_dropped = f"{_fmt(train.get(TF_KEPT_ACCURACY))} / {_fmt(train.get(TF_DROPPED_ACCURACY))}"
        lines.append(
            row(
                [
                    label,
                    _fmt(train[EXACT_MATCH]),
                    _fmt(train[ROUGE_L]),
                    _fmt(held[EXACT_MATCH]),
                    _fmt(held[ROUGE_L]),
                    kept_dropped,
                    _fmt(loss),
                ]
            )
        )
    return "\n".join(lines)
