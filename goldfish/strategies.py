"""The names of the goldfish mask strategies, importable without torch: the command line offers them as choices
and validates them before anything loads torch. goldfish.masks implements each (and re-exports STRATEGIES)."""

STRATEGIES = ("static", "hashed", "hashed-reference", "random")
