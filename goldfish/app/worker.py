"""A worker of `goldfish <command> --nproc N`: `python -m goldfish.app.worker RUN_FILE`.

It reads the run its launcher resolved and validated (goldfish.app.runfile) and runs that command's work on its
rank; it parses no command line. Its error goes back to the launcher in one line (goldfish.app.launch), and it never
outlives the launcher.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from goldfish.app.launch import CRASH_EXIT, SETTINGS_ERROR_EXIT, die_with_launcher, report_worker_error

    die_with_launcher()
    paths = list(sys.argv[1:] if argv is None else argv)
    if len(paths) != 1:
        print("usage: python -m goldfish.app.worker RUN_FILE (started by goldfish ... --nproc N)", file=sys.stderr)
        return SETTINGS_ERROR_EXIT
    from goldfish.app.commands.compare import run_compare
    from goldfish.app.commands.eval import run_eval
    from goldfish.app.commands.processes import progress_bars
    from goldfish.app.commands.train import run_train
    from goldfish.app.runfile import read_run

    try:
        run = read_run(Path(paths[0]))
        work = {"train": run_train, "compare": run_compare, "eval": run_eval}[run.command]
        with progress_bars(run.runtime.progress):
            return work(run)
    except KeyboardInterrupt:  # the launcher's forwarded Ctrl-C before training began: it says what was kept
        from goldfish.app.interrupt import INTERRUPTED_EXIT

        return INTERRUPTED_EXIT
    except (ValueError, FileNotFoundError) as error:
        if not report_worker_error(error, settings_error=True):
            print(f"goldfish worker: error: {error}", file=sys.stderr)
        return SETTINGS_ERROR_EXIT
    except Exception as error:
        if report_worker_error(error, settings_error=False):
            return CRASH_EXIT
        raise


if __name__ == "__main__":
    sys.exit(main())
