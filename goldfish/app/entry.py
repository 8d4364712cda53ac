"""The `goldfish` command's entry point: `goldfish plan` runs the torch-free planner alone; every other subcommand
goes to goldfish.app.cli (which imports torch, the engine and eval as its commands need them)."""

from __future__ import annotations

import sys
from typing import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["plan"] and "--measure" not in argv:  # --measure times collectives: torch.distributed
        from goldfish.app.plan import main as plan_main

        return plan_main(argv[1:])
    from goldfish.app.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
