"""goldfish: fine-tune causal LMs with the goldfish loss and measure memorization by extraction.

The mask and loss API lives here (torch only); the CLI (`goldfish train | eval | compare | plan | mask`) in
goldfish.app and the run wiring in goldfish.app.prepare, goldfish.app.training and goldfish.app.evaluation. The
names load on first use (PEP 562), so the command's torch-free paths (`--help`, settings errors, `goldfish plan`)
import this package without torch; the strategy names they offer come from goldfish.strategies.
"""

from __future__ import annotations

import importlib
from typing import Any

_PUBLIC = {
    "GoldfishCollator": "goldfish.collator",
    "GoldfishLoss": "goldfish.loss",
    "goldfish_loss": "goldfish.loss",
    "goldfish_loss_from_token_losses": "goldfish.loss",
    "IGNORE_INDEX": "conventions",
    "STRATEGIES": "goldfish.masks",
    "causal_targets": "goldfish.masks",
    "drop_mask": "goldfish.masks",
    "format_masked_text": "goldfish.masks",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'goldfish' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
