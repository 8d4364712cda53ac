"""`goldfish train | eval | compare | plan | mask | audit`: the command line parsed and dispatched to the command's
module (goldfish.app.commands.train, .eval, .compare, .mask; goldfish.app.plan; goldfish.app.audit), which owns its
options, its settings and its run.

Each option group is declared once in goldfish.app.options (flag -> dataclass field) and takes its defaults from a
dataclass instance of goldfish.app.config; the options of one command only are declared in its module.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Mapping, Sequence

from goldfish.app.argparsing import OneLineParser, Unset, mark_defaults, resolve_defaults
from goldfish.app.commands.compare import add_compare_parser
from goldfish.app.commands.eval import add_eval_parser
from goldfish.app.commands.mask import add_mask_parser
from goldfish.app.commands.processes import progress_bars
from goldfish.app.commands.train import add_train_parser
from goldfish.app.presets import PLAN_PRESETS


def parse_command_line(argv: Sequence[str]) -> argparse.Namespace:
    """The command line, parsed once. ``args.typed`` holds the dests the user typed; every other option holds its
    own default, except that `plan --preset NAME` fills the plan options not typed (goldfish.app.presets). The typed
    options then go over the layers of a spec, once, in the command's module: over the compare preset (--preset or
    --quick) and the model's training defaults (`commands.compare.compare_spec`, `commands.train.train_spec`), or over
    a checkpoint's settings (`train --resume`, goldfish.app.resume): what the user typed always wins."""
    parsed = build_parser().parse_args(list(argv))
    args, typed = resolve_defaults(parsed.parser, parsed, _plan_preset(parsed))
    return argparse.Namespace(**vars(args), typed=typed)


def _plan_preset(parsed: argparse.Namespace) -> list[Mapping[str, Any]]:
    """The plan options `goldfish plan --preset NAME` sets (none for another command, or without --preset)."""
    preset = getattr(parsed, "preset", None) if parsed.command == "plan" else None
    name = preset.value if isinstance(preset, Unset) else preset
    return [PLAN_PRESETS[name]().options()] if name else []


def build_parser() -> argparse.ArgumentParser:
    """The `goldfish` parser. Its subcommands' defaults are `Unset` (argparsing.mark_defaults): parsed alone, an option
    not typed reads as Unset(default); `parse_command_line` resolves them."""
    from goldfish.app.audit import add_audit_parser
    from goldfish.app.plan import add_plan_arguments, run_plan

    parser = OneLineParser(  # its subcommands' parsers are of its class: every error is one line
        prog="goldfish",
        description="Goldfish loss: train without verbatim memorization, and measure memorization by extraction.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_train_parser(sub)
    add_eval_parser(sub)
    add_compare_parser(sub)
    plan = sub.add_parser(
        "plan",
        help="rank the grids (pipe x data x X x Y x Z) for a model on a cluster by predicted "
        "step time, with memory per GPU",
    )
    add_plan_arguments(plan)
    plan.set_defaults(func=run_plan, parser=plan)
    add_mask_parser(sub)
    add_audit_parser(sub)  # goldfish/app/audit.py
    for command in sub.choices.values():  # parse_command_line tells typed options from defaults by these
        mark_defaults(command)
        command.set_defaults(parser=command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from goldfish.app.launch import CRASH_EXIT, SETTINGS_ERROR_EXIT, die_with_launcher, report_worker_error

    die_with_launcher()  # a worker of --nproc: never outlive the launcher
    args = parse_command_line(list(sys.argv[1:] if argv is None else argv))
    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)

    try:
        with progress_bars(getattr(args, "progress", True)):
            return args.func(args)
    except (ValueError, FileNotFoundError) as error:
        if not report_worker_error(error, settings_error=True):  # a worker of --nproc: its launcher prints it
            print(f"goldfish {args.command}: error: {error}", file=sys.stderr)
        return SETTINGS_ERROR_EXIT
    except Exception as error:
        if report_worker_error(error, settings_error=False):
            return CRASH_EXIT
        raise


if __name__ == "__main__":
    sys.exit(main())
