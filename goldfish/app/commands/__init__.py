"""One module per `goldfish` command, each owning its options, its settings and its run; goldfish.app.cli dispatches.

    train.py          `goldfish train` (a new run, or --resume with the checkpoint's settings)
    eval.py           `goldfish eval`
    compare.py        `goldfish compare`, its presets' descriptions and --checkpoints
    mask.py           `goldfish mask`
    option_values.py  the parsed option groups read back as the dataclasses they fill
    preflight.py      what every rank of a run would refuse, checked once before any starts
    processes.py      the grid a command launches or joins, its workers, threads and closing lines
    run_folder.py     the --out folder of a train or compare run: refused, staged, published, cleared

`goldfish plan` is goldfish.app.plan (torch-free, run by the entry point alone) and `goldfish audit` goldfish.app.audit.
"""
