"""The command-line settings of the small `goldfish train` and `goldfish compare` runs the tests start: `tiny_run`
builds them (by default the smallest run: micro-llama, 4 training documents of 48 tokens, a 320-token vocabulary), so
a test names only what it varies instead of pasting the whole argument list."""

from __future__ import annotations

import json
import random
from pathlib import Path

BACKGROUND_WORDS = (
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()
)


def random_words_background(path: Path, seed: int = 0) -> Path:
    """A background corpus for --background (jsonl): 200 documents of 20-299 words drawn from BACKGROUND_WORDS."""
    rng = random.Random(seed)
    with path.open("w") as handle:
        for _ in range(200):
            words = " ".join(rng.choice(BACKGROUND_WORDS) for _ in range(rng.randrange(20, 300)))
            handle.write(json.dumps({"text": words}) + "\n")
    return path


def tiny_run(
    *,
    model: str = "micro-llama",
    n_train: int | None = 4,
    n_heldout: int | None = 2,
    seq_len: int | None = 48,
    vocab_size: int | None = 320,
    batch_size: int | None = 2,
    epochs: int | None = None,
    no_progress: bool = True,
    threads: int | None = 1,
    **flags: object,
) -> list[str]:
    """The options of a run (no subcommand, no --out): each keyword is the option of that name with "-" for "_"
    (`id_field="id"` gives `--id-field id`). None or False leaves an option out (the CLI's default then holds), True
    gives a bare switch, a list or tuple the option followed by each item (options taking several values, e.g.
    `masks=["hashed:4:13", "random:4"]`), anything else the option and the value as text. Options come out in
    keyword order, the defaults' first."""
    settings: dict[str, object] = {
        "model": model,
        "n_train": n_train,
        "n_heldout": n_heldout,
        "seq_len": seq_len,
        "vocab_size": vocab_size,
        "batch_size": batch_size,
        "epochs": epochs,
        "no_progress": no_progress,
        "threads": threads,
        **flags,
    }
    argv: list[str] = []
    for name, value in settings.items():
        option = "--" + name.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            argv.append(option)
        elif isinstance(value, (list, tuple)):
            argv += [option, *(str(item) for item in value)]
        else:
            argv += [option, str(value)]
    return argv
