"""The application's rooms stay small (issue 45): goldfish/app/cli.py only parses and dispatches (each command's run
is in its module of goldfish/app/commands/), no module of goldfish/app is over 600 lines, and the application
imports only the engine's public API (engine.__all__)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import engine

APP = Path(__file__).resolve().parents[2] / "goldfish" / "app"
MOST_LINES = 600
# cli.py parses and dispatches; a command's options, settings and run belong in goldfish/app/commands/<command>.py.
LIMITS = {"cli.py": 250}


def _modules() -> list[str]:
    return sorted(str(path.relative_to(APP)) for path in APP.rglob("*.py"))


@pytest.mark.parametrize("module", _modules())
def test_no_app_module_is_over_its_line_limit(module: str) -> None:
    lines = len((APP / module).read_text(encoding="utf-8").splitlines())
    limit = LIMITS.get(module, MOST_LINES)
    assert lines <= limit, f"goldfish/app/{module} has {lines} lines, over {limit}: split it by concern"


def test_the_limits_name_real_modules() -> None:
    """A renamed or removed module must not leave a limit that guards nothing."""
    modules = set(_modules())
    assert set(LIMITS) <= modules and "commands/train.py" in modules


def _engine_imports(path: Path) -> list[tuple[int, str]]:
    """(line, what) of each way `path` reaches into the engine: `import engine.<module>`, `from engine.<module> import`,
    `from engine import <name>` and `engine.<name>`, at module level or inside functions."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names if a.name.split(".")[0] == "engine"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "engine":
            found += [(node.lineno, f"from {node.module} import {a.name}") for a in node.names]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "engine":
            found.append((node.lineno, f"engine.{node.attr}"))
    return found


def _is_public(what: str) -> bool:
    """Whether one engine reference of _engine_imports names the package or a name of engine.__all__."""
    if what.startswith("import "):
        return what == "import engine"
    if what.startswith("from "):
        module, name = what.removeprefix("from ").split(" import ")
        return module == "engine" and name in engine.__all__
    return what.removeprefix("engine.") in engine.__all__


def test_the_app_imports_only_the_engines_public_names() -> None:
    """goldfish/app takes the engine through `engine` alone (issue 45): no engine.<module>, no name outside
    engine.__all__ (its lazy map _PUBLIC), so the engine's rooms can move without the application noticing."""
    private = [
        f"goldfish/app/{path.relative_to(APP)}:{line}: {what}"
        for path in sorted(APP.rglob("*.py"))
        for line, what in _engine_imports(path)
        if not _is_public(what)
    ]
    assert not private, "imports past the engine's public API (add the name to engine._PUBLIC):\n" + "\n".join(private)


def test_the_check_sees_private_engine_imports(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "import engine\nimport engine.core.comm\nfrom engine.spec import AXES\nfrom engine import Grid, _PUBLIC\n"
        "def f():\n    from engine.training.train import train\n    return engine.init, engine.core\n"
    )
    assert [(line, what) for line, what in _engine_imports(source) if not _is_public(what)] == [
        (2, "import engine.core.comm"),
        (3, "from engine.spec import AXES"),
        (4, "from engine import _PUBLIC"),
        (6, "from engine.training.train import train"),
        (7, "engine.core"),
    ]


def test_every_public_engine_name_resolves() -> None:
    """Each entry of engine's lazy map names a module that defines it (a moved or renamed name fails here, not in a
    user's import)."""
    missing = [name for name in engine.__all__ if not hasattr(importlib.import_module(engine._PUBLIC[name]), name)]
    assert not missing, f"engine._PUBLIC names these where their module does not define them: {missing}"
    assert all(getattr(engine, name) is not None for name in engine.__all__)
