"""The check every `goldfish plan` refusal test makes: bad options end in one line on stderr and exit 2, before any
output."""

from __future__ import annotations

import pytest

from goldfish.app.plan import main as plan_main


def assert_plan_refuses(argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`goldfish plan argv` exits 2 with one `goldfish plan: error: ` line containing `expected`, and prints nothing."""
    try:
        code = plan_main(argv)
    except SystemExit as stop:  # argparse's own refusals
        code = stop.code
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith("goldfish plan: error: "), captured.err
    assert expected in captured.err
