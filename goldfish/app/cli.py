"""`goldfish train | eval | compare | plan | mask | audit`: the command line parsed and dispatched to the command's
module (goldfish.app.commands.train, .eval, .compare, .mask; goldfish.app.plan; goldfish.app.audit), which owns its
options, its settings and its run.

Each option group is declared once in goldfish.app.options (flag -> dataclass field) and takes its defaults from a
dataclass instance of goldfish.app.config; the options of one command only are declared in its module.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from goldfish.app.argparsing import OneLineParser
from goldfish.app.commands.compare import add_compare_parser
from goldfish.app.commands.eval import add_eval_parser
from goldfish.app.commands.mask import add_mask_parser
from goldfish.app.commands.processes import progress_bars
from goldfish.app.commands.train import add_train_parser
from goldfish.app.config import COMPARE_PRESETS, model_defaults


def parse_command_line(argv: Sequence[str]) -> argparse.Namespace:
    """The parsed command line, with the training defaults that fit --model (config.model_defaults) and then
    `compare --preset NAME` (or --quick) applied: their values become the subcommand parser's defaults and the
    command line is parsed again, so every option the user typed wins over the preset, and the preset over the
    model's defaults (argparse sets only what was typed over a default). ``args.argv`` keeps the arguments."""
    parser = build_parser()
    args = parser.parse_args(list(argv))
    fitted = model_defaults(getattr(args, "model", None)) if args.command in ("train", "compare") else {}
    if fitted:  # the training defaults that fit --model; a preset's values and typed ones win over them
        args.parser.set_defaults(**fitted)
        args = parser.parse_args(list(argv))
    preset = "quick" if getattr(args, "quick", False) else getattr(args, "preset", None)
    if args.command == "compare" and preset is not None:
        args.parser.set_defaults(**COMPARE_PRESETS[preset])
        args = parser.parse_args(list(argv))
    if args.command == "plan" and args.preset is not None:  # as goldfish.app.plan.parse_plan_args
        from goldfish.app.plan import PLAN_PRESETS

        args.parser.set_defaults(**PLAN_PRESETS[args.preset])
        args = parser.parse_args(list(argv))
    args.argv = list(argv)
    return args


def build_parser() -> argparse.ArgumentParser:
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
