"""Conventions every floor shares, defined once beneath them all.

data/, the goldfish library, engine/ and eval/ may not import each other at the ground (docs/architecture.md,
"Floors"), yet each reads the same target convention; this package holds such constants only and imports nothing.
"""

from __future__ import annotations

IGNORE_INDEX = -100  # torch's cross-entropy convention: a target equal to it gives no loss (a position with no target)
