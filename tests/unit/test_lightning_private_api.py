"""The engine's Lightning strategies use a few of Lightning's private names where Lightning has no public API for
the job (its own DDP strategies use the same ones): the subprocess launcher behind `devices=N`, the no-sync
control, the process-group start and its all-reduce, strict-key validation, moving optimizer state. The `lightning`
extra pins a minor release (pyproject.toml); this test names exactly which private import a new release moved."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

pytest.importorskip("lightning")

ENGINE = Path(__file__).resolve().parents[2] / "engine"


def _private_lightning_imports() -> list[tuple[str, str, str]]:
    """(engine file, Lightning module, private name) of every `from lightning... import _name` under engine/."""
    found = []
    for path in sorted(ENGINE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lightning"):
                for alias in node.names:
                    if alias.name.startswith("_"):
                        found.append((str(path.relative_to(ENGINE.parent)), node.module, alias.name))
    return found


def test_the_engine_uses_only_the_known_private_lightning_names() -> None:
    names = {name for _, _, name in _private_lightning_imports()}
    # Review a new private name before adding it here: is there a public API for the job now?
    assert names <= {
        "_SubprocessScriptLauncher",
        "_BackwardSyncControl",
        "_validate_keys_for_strict_loading",
        "_init_dist_connection",
        "_sync_ddp_if_available",
        "_optimizers_to_device",
    }, names


@pytest.mark.parametrize("where, module, name", _private_lightning_imports())
def test_private_lightning_name_is_where_the_engine_imports_it(where: str, module: str, name: str) -> None:
    import lightning

    try:
        found = hasattr(importlib.import_module(module), name)
    except ImportError:
        found = False
    assert found, (
        f"Lightning {lightning.__version__} has no {module}.{name}, which {where} imports (Lightning "
        f"offers no public API for it): find where this release moved it, or what replaced it, and "
        f"update {where}"
    )
