"""Scalars of a training run for experiment trackers (`--report-to`): the numbers of metrics.jsonl, step by step.

tensorboard (optional extra: pip install -e ".[tensorboard]"): OUT/tensorboard holds one event file with a scalar
per numeric field of every metrics.jsonl record ("loss", "lr", "val_loss", ...), at its optimizer step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal, get_args

ReportTo = Literal["none", "tensorboard"]  # --report-to: no tracker, or TensorBoard event files
REPORT_TO: tuple[ReportTo, ...] = get_args(ReportTo)


def check_report_to(kind: str) -> None:
    """Refuse an unknown tracker, or tensorboard when it is not installed (before any process starts)."""
    if kind not in REPORT_TO:
        raise ValueError(f"--report-to {kind!r}: choose one of {', '.join(REPORT_TO)}")
    if kind == "tensorboard":
        try:
            import tensorboard  # noqa: F401
        except ImportError:
            raise ValueError(
                "--report-to tensorboard needs the tensorboard package. Fix: pip install -e "
                '".[tensorboard]" (or pip install tensorboard)'
            ) from None


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The numeric fields of a metrics record (step aside), as floats."""
    return {
        key: float(value)
        for key, value in record.items()
        if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)
    }


@contextlib.contextmanager
def tracker(kind: ReportTo, out_dir: Path | None) -> Iterator[Callable[[dict[str, Any]], None] | None]:
    """An on_log callback for engine.training.train (main process) writing each record's scalars, or None for "none"."""
    if kind == "none" or out_dir is None:
        yield None
        return
    check_report_to(kind)
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(Path(out_dir) / "tensorboard"))

    def on_log(record: dict[str, Any]) -> None:
        for key, value in scalars(record).items():
            writer.add_scalar(key, value, global_step=int(record["step"]))

    try:
        yield on_log
    finally:
        writer.close()
