"""A resolved run as a file: what the `--nproc` launcher hands its workers instead of its command line.

The launcher parses and validates the command once (every check, the preset, --resume's recorded settings, the
staging folder of --overwrite), then writes one `ResolvedRun` as JSON and starts each worker as
`python -m goldfish.app.worker FILE`. A worker reads the file and runs the command's work on its rank: it parses no
argv and validates nothing again, so what every rank runs is exactly what the launcher checked.

The JSON is plain data (no pickle): dataclasses are written field by field and rebuilt through their constructors
from their declared field types (`to_plain` / `from_plain`).
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # goldfish.app.config imports the settings of the lower floors; a worker reads them when it runs
    from goldfish.app.config import Command, RunSpec, Runtime

# Set in every worker a --nproc launcher starts: the folder its workers report their errors into (goldfish.app.launch);
# a process that has it is a worker, and its launcher speaks for it.
ERROR_DIR_VARIABLE = "GOLDFISH_ERROR_DIR"

RUN_FILE_VERSION = 1


def to_plain(value: Any) -> Any:
    """`value` as JSON-ready data: dataclasses as {field: value}, tuples as lists, Paths as strings."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, Path):
        return str(value)
    return value


def from_plain(kind: Any, value: Any) -> Any:
    """Rebuild a value of type `kind` (a dataclass, list[...], tuple[...], X | None, or a plain type) from to_plain's
    data; a dataclass goes through its constructor, so it validates itself as when it was first built."""
    if value is None:
        return None
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(kind) if a is not type(None)]
        dataclass_options = [a for a in options if dataclasses.is_dataclass(a)]
        if isinstance(value, dict) and dataclass_options:
            return from_plain(dataclass_options[0], value)
        return from_plain(options[0], value) if len(options) == 1 else value
    if origin in (list, tuple):
        args = [a for a in typing.get_args(kind) if a is not Ellipsis]
        items = [from_plain(args[0], v) if args else v for v in value]
        return items if origin is list else tuple(items)
    if dataclasses.is_dataclass(kind):
        hints = typing.get_type_hints(kind)
        names = {f.name for f in dataclasses.fields(kind) if f.init}
        unknown = sorted(set(value) - names)
        if unknown:
            raise ValueError(f"{kind.__name__} has no field {', '.join(unknown)}")
        return kind(**{name: from_plain(hints[name], v) for name, v in value.items()})
    if kind is Path:
        return Path(value)
    return value


@dataclass(frozen=True)
class ResolvedRun:
    """Everything a worker of `goldfish <command> --nproc N` needs, resolved by the launcher.

    command: "train", "compare" or "eval". spec: the command's settings (goldfish.app.config.TrainSpec,
    CompareSpec or EvalSpec). runtime: goldfish.app.config.Runtime without nproc (a worker launches nothing).
    out: the run folder the user named; folder: where the run writes (out, or the staging folder of --overwrite).
    resume: the checkpoint a train run continues (None: a new run)."""

    command: Command
    spec: RunSpec
    runtime: Runtime
    out: str
    folder: str
    resume: str | None = None
    options: dict[str, Any] = field(default_factory=dict)  # command-specific resolved values (e.g. eval's part)


def spec_type(command: str) -> type[RunSpec]:
    """The settings dataclass of a command's spec."""
    from goldfish.app.config import CompareSpec, EvalSpec, TrainSpec

    kinds = {"train": TrainSpec, "compare": CompareSpec, "eval": EvalSpec}
    if command not in kinds:
        raise ValueError(f"a resolved run is for train, compare or eval, not {command!r}")
    return kinds[command]


def write_run(run: ResolvedRun, path: Path) -> Path:
    """Write `run` to `path` as JSON (atomically: a worker never reads half a file) and return the path."""
    from data.atomic import write_text_atomic

    data = {"version": RUN_FILE_VERSION, **to_plain(run)}
    write_text_atomic(path, json.dumps(data, indent=1))
    return path


def read_run(path: Path) -> ResolvedRun:
    """The ResolvedRun `write_run` wrote to `path`."""
    from goldfish.app.config import Runtime

    data = json.loads(Path(path).read_text())
    if data.pop("version", None) != RUN_FILE_VERSION:
        raise ValueError(f"{path} is not a run file of this goldfish version (version {RUN_FILE_VERSION} expected)")
    command = data["command"]
    return ResolvedRun(
        command=command,
        spec=from_plain(spec_type(command), data["spec"]),
        runtime=from_plain(Runtime, data["runtime"]),
        out=data["out"],
        folder=data["folder"],
        resume=data.get("resume"),
        options=data.get("options", {}),
    )
