"""The goldfish application: the `goldfish` command and the runs behind it.

    cli.py         `goldfish train | eval | compare | plan | mask | audit`: parses the command line and dispatches
    commands/      one module per command (train, eval, compare, mask), each owning its options, settings and run
    options.py     every flag of the shared option groups, declared once (flag -> dataclass field)
    config.py      the dataclasses those flags fill, with the one set of defaults
    presets.py     the presets of compare and plan, and the training defaults that fit a model
    prepare.py     data preparation: documents, the tokenizer, the training and held-out selection
    training_rows.py  masked training examples and the goldfish step loss the engine calls
    training.py    one training run as a short sequence of parts; records.py its run and checkpoint records
    model_files.py starting weights and HF checkpoint folders; run_grid.py the engine grid of a run
    background_run.py  the background stream of a --background run
    evaluation.py  extraction, the instruments and membership inference on a model
    compare.py     `goldfish compare` as a `Comparison` whose steps read top to bottom
    models.py      tiny model presets; loading a model sharded for parallel evaluation
    pretrained.py  HF / GGUF loading (SmolLM2-135M ships offline)
    plan.py        `goldfish plan` over engine.planner.plan
    planning.py    the planner's shape of a transformers model, read from the plan the engine shards it by
    report.py      report.md and the plots

It is the only layer that imports every package (data, the goldfish library, engine, eval, matplotlib). The
library users import, `import goldfish` (masks, loss, collator), needs torch alone and never loads this package.

The front door is light: entry.py, cli.py's parser (with the commands' option declarations), options.py, config.py and
argparsing.py import no torch, so every `--help` and every settings error answers at once; the modules that compute
(prepare, training, evaluation, compare, models, the engine, eval) load inside the command, once its settings have
passed (tests/e2e/test_front_door.py keeps it so).
"""
