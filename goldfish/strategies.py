"""The names of the goldfish mask strategies, importable without torch: the command line offers them as choices
and validates them before anything loads torch. goldfish.masks implements each (and re-exports STRATEGIES).

``STRATEGY_DEFAULTS`` gives the (k, h) a strategy takes when the user names none (the command line and
``goldfish.app.config.mask_spec``; ``drop_mask`` itself always takes k and h from its caller). The two masks of
the Swiss AI Megatron-LM ports default to the setting Apertus was pretrained with, k=50 and h=50.
``WINDOW_STRATEGIES`` are those that decide from a window of h targets (the others ignore h)."""

STRATEGIES = ("static", "hashed", "hashed-reference", "random", "apertus", "megatron-2026")

DEFAULT_K = 4
DEFAULT_H = 13
STRATEGY_DEFAULTS: dict[str, tuple[int, int]] = {"apertus": (50, 50), "megatron-2026": (50, 50)}

WINDOW_STRATEGIES = ("hashed", "hashed-reference", "apertus", "megatron-2026")


def default_k_h(strategy: str | None) -> tuple[int, int]:
    """(k, h) of a strategy where the user gives none: 50, 50 for apertus and megatron-2026, else 4, 13."""
    return STRATEGY_DEFAULTS.get(strategy or "", (DEFAULT_K, DEFAULT_H))
