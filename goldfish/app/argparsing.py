"""Command-line errors in one line: `goldfish train: error: --k: expected an integer, got 'x' (...--help...)`.

argparse prints the whole usage (dozens of lines for `goldfish train`) before its error, and names the Python
function that failed to convert a value ("invalid parse_repeats value"). `OneLineParser` prints only the error,
naming the option, with a pointer to --help, and exits 2; `argument_type` turns a parse function's own ValueError
message into the error text. Torch-free: `goldfish plan` uses it too.
"""

from __future__ import annotations

import argparse
import difflib
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, NoReturn, Sequence

_EXPECTED = {"int": "an integer", "float": "a number"}
_INVALID_VALUE = re.compile(r"invalid (?P<type>\S+) value: (?P<value>.*)$")


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr (exit 2), naming the option and the fix.

    Options must be spelled out (allow_abbrev=False, inherited by the subcommands' parsers, which are of this
    class): an abbreviation such as `--epoch` for `--epochs` is an error naming the option meant, not a second
    spelling that code reading the command line (the --nproc relaunch) would have to recognise too."""

    def __init__(self, *args: Any, allow_abbrev: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, allow_abbrev=allow_abbrev, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {_plain(message)}{self._suggestion(message)} (see {self.prog} --help)\n")

    def _suggestion(self, message: str) -> str:
        """For an unrecognized option, the closest option of this parser or its subcommands ("did you mean")."""
        if not message.startswith("unrecognized arguments: "):
            return ""
        typed = next((w for w in message.split()[2:] if w.startswith("--")), None)
        known = [o for p in [self, *_subcommand_parsers(self)] for a in p._actions for o in a.option_strings]
        option = typed.split("=")[0] if typed else ""
        close = difflib.get_close_matches(option, known, n=1, cutoff=0.7) if typed else []
        if close and close[0] == option:  # an option of another subcommand: naming it again would not help
            return ""
        return f"; did you mean {close[0]}?" if close else ""


@dataclass(frozen=True)
class Unset:
    """An option's default while the command line is parsed (`mark_defaults`): argparse leaves it in place of every
    option not typed, so the one parse tells which options were typed. `value` is the option's own default, which
    --help shows (`%(default)s` prints str(Unset)) and `resolve_defaults` falls back to."""

    value: Any

    def __str__(self) -> str:
        return str(self.value)


def mark_defaults(parser: argparse.ArgumentParser) -> None:
    """Wrap the default of every option of `parser` (not of its subcommands) in `Unset`."""
    for action in parser._actions:
        if action.dest != argparse.SUPPRESS and action.default is not argparse.SUPPRESS:
            action.default = Unset(action.default)


def resolve_defaults(
    parser: argparse.ArgumentParser, args: argparse.Namespace, layers: Sequence[Mapping[str, Any]]
) -> tuple[argparse.Namespace, frozenset[str]]:
    """(args with every option the user did not type filled in, the dests typed). An option not typed takes its value
    from the last of `layers` that sets it (e.g. model defaults, then a preset), else its own default; a string from
    a layer or a default is parsed by the option's type, as if typed (argparse does so with string defaults). `args`
    is left as parsed: the result is a new namespace."""
    actions = {action.dest: action for action in parser._actions}
    typed = frozenset(dest for dest, value in vars(args).items() if dest in actions and not isinstance(value, Unset))
    layered: dict[str, Any] = {}
    for layer in layers:
        layered.update(layer)
    values = dict(vars(args))
    for dest in set(values) | set(layered):
        if dest in typed:
            continue
        value = values.get(dest)
        value = layered.get(dest, value.value if isinstance(value, Unset) else value)
        action = actions.get(dest)
        if isinstance(value, str) and action is not None and action.type is not None:
            value = action.type(value)
        values[dest] = value
    return argparse.Namespace(**values), typed


def _subcommand_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    return [
        choice
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for choice in action.choices.values()
    ]


def _plain(message: str) -> str:
    """argparse's message without its wording for programmers: "argument --k: invalid int value: 'x'" becomes
    "--k: expected an integer, got 'x'"; a conversion error of another type no longer names a Python function."""
    option, separator, text = message.partition(": ")
    if not (option.startswith("argument ") and separator):
        return message
    option = option.removeprefix("argument ").split("/")[0]
    invalid = _INVALID_VALUE.match(text)
    if invalid:
        expected = _EXPECTED.get(invalid["type"])
        text = f"expected {expected}, got {invalid['value']}" if expected else f"invalid value {invalid['value']}"
    return f"{option}: {text}"


def argument_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """`parse` as an argparse `type=`: a ValueError it raises becomes the option's error text (argparse would
    replace it by "invalid <function name> value"); int and float say what they expect."""
    expected = _EXPECTED.get(getattr(parse, "__name__", ""))

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as error:
            reason = f"expected {expected}, got {text!r}" if expected else str(error) or f"invalid value {text!r}"
            raise argparse.ArgumentTypeError(reason) from None

    convert.__name__ = getattr(parse, "__name__", "value")  # argparse's fallback wording names it
    return convert


def positive_int(text: str) -> int:
    """An integer >= 1 (a count of threads or processes)."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """An integer >= 0 (a count where 0 means none or all, as the option says)."""
    return _int_at_least(text, 0)


def _int_at_least(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"expected an integer >= {least}, got {text!r}") from None
    if value < least:
        raise ValueError(f"must be >= {least}, got {value}")
    return value


def parse_device(text: str) -> str:
    """A torch device this machine has: cpu, or cuda / cuda:N (mps, xpu ...) where torch can use it."""
    if text == "cpu":  # always there: no need to load torch to know (a bad option's error stays instant)
        return text
    import torch  # here, not at import: `goldfish plan` and the settings checks stay torch-free

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise ValueError(f"unknown device {text!r}: use cpu, cuda or cuda:N") from None
    if device.type == "cpu":
        return text
    backend = getattr(torch, device.type, None)
    if backend is None or not hasattr(backend, "is_available"):
        raise ValueError(f"goldfish cannot run on device {text!r}: use cpu, cuda or cuda:N")
    if not backend.is_available():
        build = " (this torch is a CPU build)" if device.type == "cuda" and torch.version.cuda is None else ""
        raise ValueError(f"{device.type} is not available on this machine{build}: use --device cpu")
    count = backend.device_count() if hasattr(backend, "device_count") else 1
    if device.index is not None and device.index >= count:
        raise ValueError(f"{text} does not exist: this machine has {count} {device.type} device(s), 0 to {count - 1}")
    return text
