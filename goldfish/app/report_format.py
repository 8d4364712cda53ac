"""Formatting shared by the report modules: numbers and intervals as text, Markdown tables and figure links, one
colour per model, PNGs written atomically.

Figures are made with matplotlib's object API (`new_figure`): a Figure that renders to PNG with Agg and never
touches pyplot's global backend or figure list, so importing the report modules changes nothing in the process."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from matplotlib.figure import Figure

from data.atomic import write_atomic

NON_FINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}  # how strict-JSON result files spell them


def new_figure(nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float], **subplots: Any) -> tuple[Figure, Any]:
    """(figure, axes) as pyplot.subplots returns them (`subplots`: squeeze, gridspec_kw ...), from a plain Figure
    that no display backend or pyplot state is involved in (savefig renders PNG with Agg)."""
    figure = Figure(figsize=figsize)
    return figure, figure.subplots(nrows, ncols, **subplots)


def save_figure(figure: Figure, path: Path) -> None:
    """Save a matplotlib figure as PNG atomically, so a reader never sees half a PNG."""
    figure.tight_layout()
    write_atomic(path, lambda tmp: figure.savefig(tmp, dpi=110, format="png"))


def fmt(value: Any) -> str:
    """3 decimals for floats, n/a for missing or NaN, inf spelled out."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, str) and value in NON_FINITE:
        value = NON_FINITE[value]
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return f"{value:.3f}"
    return str(value)


def fmt_ci(value: Any, ci: Sequence[float] | None) -> str:
    """A value with its 95% bootstrap interval, "0.620 [0.550, 0.700]" (the value alone without an interval)."""
    if not ci:
        return fmt(value)
    return f"{fmt(value)} {fmt_interval(ci)}"


def fmt_interval(ci: Sequence[float] | None) -> str:
    """An interval alone, "[0.550, 0.700]" ("" without one)."""
    return f"[{fmt(ci[0])}, {fmt(ci[1])}]" if ci else ""


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
    ]


def figure_link(name: str, alt: str, figures: Sequence[str]) -> list[str]:
    return [f"![{alt}]({name})", ""] if name in figures else []


def palette(labels: Sequence[str]) -> dict[str, str]:
    """One matplotlib colour per label, in label order, so a model keeps its colour in every plot."""
    return {label: f"C{i % 10}" for i, label in enumerate(labels)}


def fmt_count(value: Any) -> str:
    """A number of samples: whole below a million, scientific above (they reach 1e48 for unmemorized text)."""
    if value is None:
        return "n/a"
    value = float(value)  # also reads the strings "inf" and "nan" of strict-JSON files
    if math.isnan(value):
        return "n/a"
    if math.isinf(value):
        return "inf"
    return f"{value:,.0f}" if value < 1e6 else f"{value:.2e}"
