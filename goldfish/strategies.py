"""The names of the goldfish mask strategies, importable without torch: the command line offers them as choices
and validates them before anything loads torch. goldfish.masks implements each (and re-exports STRATEGIES).

``STRATEGY_DEFAULTS`` gives the (k, h) a strategy takes when the user names none (the command line and
``goldfish.app.config.mask_spec``; ``drop_mask`` itself always takes k and h from its caller). The two masks of
the Swiss AI Megatron-LM ports default to the setting Apertus was pretrained with, k=50 and h=50.
``WINDOW_STRATEGIES`` are those that decide from a window of h targets (the others ignore h)."""

from typing import Literal, get_args

# A goldfish mask strategy, the one spelling of the names (the command line's choices are STRATEGIES).
Strategy = Literal["static", "hashed", "hashed-reference", "random", "apertus", "megatron-2026"]
STRATEGIES: tuple[Strategy, ...] = get_args(Strategy)

DEFAULT_K = 4
DEFAULT_H = 13
STRATEGY_DEFAULTS: dict[Strategy, tuple[int, int]] = {"apertus": (50, 50), "megatron-2026": (50, 50)}

WINDOW_STRATEGIES: tuple[Strategy, ...] = ("hashed", "hashed-reference", "apertus", "megatron-2026")


def default_k_h(strategy: Strategy | None) -> tuple[int, int]:
    """(k, h) of a strategy where the user gives none: 50, 50 for apertus and megatron-2026, else 4, 13."""
    return STRATEGY_DEFAULTS.get(strategy, (DEFAULT_K, DEFAULT_H)) if strategy else (DEFAULT_K, DEFAULT_H)
