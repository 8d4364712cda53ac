"""The `goldfish` command's entry point: `goldfish plan` runs the torch-free planner alone; every other subcommand
goes to goldfish.app.cli (which imports torch, the engine and eval as its commands need them)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Sequence

SETTINGS_ERROR_EXIT = 2
TOOLKIT_PACKAGES = ("data", "eval", "engine")  # installed as top-level packages beside goldfish


def shadowed_package() -> str | None:
    """The one-line complaint when a toolkit package (`data`, `eval`, `engine`) would be imported from somewhere
    other than beside the installed `goldfish` package, e.g. a `data/` folder or `eval.py` in the working directory
    under `python -m goldfish`; None when all three are the toolkit's. Looks up the packages without importing
    them, so nothing of the impostor runs."""
    home = Path(__file__).resolve().parents[2]  # the folder holding goldfish/, data/, eval/, engine/
    for name in TOOLKIT_PACKAGES:
        spec = importlib.util.find_spec(name)
        origin = getattr(spec, "origin", None) if spec is not None else None
        found = Path(origin).resolve() if origin else None
        if found != home / name / "__init__.py":
            where = found or next(iter(getattr(spec, "submodule_search_locations", None) or []), "nowhere")
            return (
                f"the module '{name}' would be imported from {where}, not from the toolkit at {home / name}: "
                f"run the installed `goldfish` command, or run from a folder without a '{name}' module"
            )
    return None


def main(argv: Sequence[str] | None = None) -> int:
    from goldfish.app.threads import WAIT_POLICY_VARIABLE, machine_is_busy, wait_policy_environment

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["train"], ["eval"], ["compare"]) and WAIT_POLICY_VARIABLE not in os.environ:
        # before anything loads torch and with it OpenMP (goldfish.app.threads); the commands that train or decode
        wait_policy_environment(os.environ, busy=machine_is_busy())
    complaint = shadowed_package()
    if complaint:
        print(f"goldfish: error: {complaint}", file=sys.stderr)
        return SETTINGS_ERROR_EXIT
    if argv[:1] == ["plan"] and "--measure" not in argv:  # --measure times collectives: torch.distributed
        from goldfish.app.plan import main as plan_main

        return plan_main(argv[1:])
    from goldfish.app.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
