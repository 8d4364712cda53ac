"""The application's rooms stay small (issue 45): goldfish/app/cli.py only parses and dispatches (each command's run
is in its module of goldfish/app/commands/), and no module of goldfish/app is over 600 lines."""

from __future__ import annotations

from pathlib import Path

import pytest

APP = Path(__file__).resolve().parents[2] / "goldfish" / "app"
MOST_LINES = 600
# cli.py parses and dispatches; a command's options, settings and run belong in goldfish/app/commands/<command>.py.
LIMITS = {"cli.py": 250}
# Modules still being split (issue 45: report.py by concern, compare.py's sections):
# expected over the limit until then; xfail(strict=False) turns into a pass, not an error, once they are under.
BEING_SPLIT = frozenset({"report.py", "compare.py"})


def _modules() -> list[str]:
    return sorted(str(path.relative_to(APP)) for path in APP.rglob("*.py"))


@pytest.mark.parametrize(
    "module",
    [
        pytest.param(m, marks=pytest.mark.xfail(reason="being split (issue 45)", strict=False))
        if m in BEING_SPLIT
        else m
        for m in _modules()
    ],
)
def test_no_app_module_is_over_its_line_limit(module: str) -> None:
    lines = len((APP / module).read_text(encoding="utf-8").splitlines())
    limit = LIMITS.get(module, MOST_LINES)
    assert lines <= limit, f"goldfish/app/{module} has {lines} lines, over {limit}: split it by concern"


def test_the_limits_name_real_modules() -> None:
    """A renamed or removed module must not leave a limit or an expected failure that guards nothing."""
    modules = set(_modules())
    assert set(LIMITS) <= modules and BEING_SPLIT <= modules and "commands/train.py" in modules
