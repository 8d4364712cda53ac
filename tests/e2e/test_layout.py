"""The floors and rooms of docs/architecture.md hold: the library users import needs torch alone, the engine knows
nothing of goldfish or eval, its rooms import only the rooms below them (core knows no transformers, the planner no
torch, `goldfish plan` runs without torch), and only engine/core/comm.py (plus grid.py and measure.py) calls
torch.distributed."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_goldfish_needs_torch_alone() -> None:
    code = (
        "import sys, goldfish; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('engine', 'eval', 'data', 'transformers', 'matplotlib', 'datasets') or m.startswith('goldfish.app')); "
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_goldfish_plan_and_the_planner_run_without_torch() -> None:
    """`goldfish plan` and engine.planner are plain Python (engine.spec is all they take from the runtime): they run
    where torch is not installed, and `import engine` loads nothing until a name is used."""
    code = (
        "import sys; from goldfish.app.entry import main; "
        "rc = main(['plan', '--model', '7B', '--gpus', '8', '--top', '1']); "
        "import engine, engine.spec, engine.planner.cost_model, engine.planner.plan, engine.planner.profiles; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'transformers', 'safetensors', 'datasets', 'numpy')); print(rc, bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip().splitlines()[-1] == "0 []", out.stdout[-2000:]


def test_planner_imports_only_the_run_description_of_the_runtime() -> None:
    offenders = []
    for path in (ROOT / "engine" / "planner").glob("*.py"):
        if path.name == "measure.py":  # times real collectives: torch.distributed by design
            continue
        # module level only: reading an HF config (--model NAME_OR_FOLDER) imports transformers when it happens
        top = ast.parse(path.read_text()).body
        names = {alias.name for node in top if isinstance(node, ast.Import) for alias in node.names}
        names |= {node.module for node in top if isinstance(node, ast.ImportFrom) and node.module and not node.level}
        for name in names:
            if name.split(".")[0] in ("torch", "transformers", "safetensors") or (
                name.startswith("engine.") and not name.startswith(("engine.planner", "engine.spec"))
            ):
                offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not offenders, offenders


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_floors_import_only_downwards() -> None:
    forbidden = {
        "engine": ("goldfish", "eval"),
        "data": ("goldfish", "engine", "eval"),
        "eval": ("goldfish.app",),
        "goldfish": ("engine", "eval", "data", "goldfish.app"),  # the library modules at goldfish/ (not app/)
        "conventions": ("goldfish", "engine", "eval", "data"),  # beneath every floor: constants only
    }
    offenders = []
    for package, banned in forbidden.items():
        # goldfish/__main__.py is `python -m goldfish`, the command: it runs the app, and `import goldfish` never
        # loads it.
        files = (
            [f for f in (ROOT / package).glob("*.py") if f.name != "__main__.py"]
            if package == "goldfish"
            else (ROOT / package).rglob("*.py")
        )
        for path in files:
            for name in _imports(path):
                if any(name == b or name.startswith(b + ".") for b in banned):
                    offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not offenders, offenders


def test_only_comm_grid_and_measure_call_torch_distributed() -> None:
    """Collectives go through engine/core/comm.py; torch's own distributed machinery (FSDP2, DeviceMesh) may be used
    where it composes with the grid, but no other module calls torch.distributed's collectives directly."""
    allowed = {"engine/core/comm.py", "engine/core/grid.py", "engine/planner/measure.py"}
    offenders = []
    for package in ("engine", "eval", "goldfish", "data"):
        for path in (ROOT / package).rglob("*.py"):
            relative = str(path.relative_to(ROOT))
            if relative in allowed:
                continue
            source = path.read_text()
            if (
                "import torch.distributed as dist" in source
                or "from torch import distributed" in source
                or "torch.distributed.barrier" in source
                or "torch.distributed.all_" in source
            ):
                offenders.append(relative)
    assert not offenders, offenders


# Each room of engine/ and the rooms it may import (itself included); see docs/architecture.md, "Engine rooms".
# engine/planner/measure.py times collectives on a machine: the one planner module allowed torch and engine.core.
# The planner is plain Python beside spec: the rooms above it may read its shapes (engine/models/shape.py fills one).
ROOMS: dict[str, tuple[str, ...]] = {
    "spec": ("spec",),
    "core": ("spec", "core"),
    "models": ("spec", "planner", "core", "models"),
    "memory": ("spec", "planner", "core", "models", "memory"),
    "training": ("spec", "planner", "core", "models", "memory", "training"),
    "planner": ("spec", "planner"),
    "integrations": ("spec", "planner", "core", "models", "memory", "training", "integrations"),
}
TOP_LEVEL = {"__init__.py", "spec.py"}


def test_engine_is_in_rooms() -> None:
    top = {p.name for p in (ROOT / "engine").glob("*.py")}
    assert top == TOP_LEVEL, f"engine/ keeps {sorted(TOP_LEVEL)} at its top; move {sorted(top - TOP_LEVEL)} to a room"
    rooms = {p.name for p in (ROOT / "engine").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert rooms == set(ROOMS) - {"spec"}, rooms


def test_rooms_import_only_downwards() -> None:
    offenders = []
    for path in (ROOT / "engine").rglob("*.py"):
        if path == ROOT / "engine" / "__init__.py":
            continue  # the public API: loads its names lazily, from every room
        room = path.relative_to(ROOT / "engine").parts[0].removesuffix(".py")
        allowed = ROOMS[room] + (("core",) if path.name == "measure.py" else ())
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] == "engine" and len(parts) > 1 and parts[1] not in allowed:
                offenders.append(f"{path.relative_to(ROOT)} ({room}) imports {name}")
    assert not offenders, offenders


def test_core_knows_no_transformers() -> None:
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in (ROOT / "engine" / "core").rglob("*.py")
        for name in _imports(path)
        if name.split(".")[0] in ("transformers", "safetensors")
    ]
    assert not offenders, offenders
