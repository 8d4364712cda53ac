"""One ignore index (issue 45): the target convention is defined once, in conventions/ beneath every floor, and the
code of data/, the goldfish library, engine/ and eval/ imports it instead of spelling -100 again."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import conventions

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("conventions", "data", "goldfish", "engine", "eval")


def _code_tokens(path: Path) -> list[tokenize.TokenInfo]:
    """The file's tokens less comments and strings (docstrings may say -100 in words)."""
    skip = {tokenize.COMMENT, tokenize.STRING, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline)
    return [t for t in tokens if t.type not in skip]


def _spellings(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """Every `-100` in code and every `IGNORE_INDEX = ...` assignment under root/<package>, as 'path:line'."""
    found = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            tokens = _code_tokens(path)
            for before, token in zip(tokens, tokens[1:]):
                if before.string == "-" and token.type == tokenize.NUMBER and token.string == "100":
                    found.append(f"{path.relative_to(root)}:{token.start[0]}")
            text = path.read_text(encoding="utf-8")
            for match in re.finditer(r"^[ \t]*IGNORE_INDEX[ \t]*(?::[^=\n]*)?=", text, re.M):
                found.append(f"{path.relative_to(root)}:{text[: match.start()].count(chr(10)) + 1}")
    return found


def test_the_ignore_index_is_defined_once_and_spelled_nowhere_else() -> None:
    assert conventions.IGNORE_INDEX == -100  # torch's cross-entropy default
    assert _spellings() == ["conventions/__init__.py:9", "conventions/__init__.py:9"]


def test_the_scan_finds_a_second_spelling(tmp_path: Path) -> None:
    """The scan is not blind: it sees a bare -100 in code and a second definition, not the words of a docstring."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(
        '"""targets are -100 where none."""\n\nIGNORE_INDEX = -100\nx = y != -100  # -100\n', encoding="utf-8"
    )
    assert _spellings(tmp_path, ("pkg",)) == ["pkg/m.py:3", "pkg/m.py:4", "pkg/m.py:3"]
