"""The one way this project writes files: atomically, so a reader never sees a half-written file or folder.

A file is written to a temporary sibling in the same folder, flushed and fsync'ed, renamed over the target
(`os.replace`, atomic on POSIX within one filesystem), and the folder itself is fsync'ed so the rename survives a
power cut. A folder (a checkpoint, a run) is filled under a staging sibling and swapped in with `replace_directory`.

Every floor uses it: data (manifests), engine (checkpoints, profiles), eval (result rows) and the application
(run records, reports, plots). It lives on the ground floor because it imports nothing of the project.
"""

from __future__ import annotations

import glob
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable


def fsync_directory(directory: str | Path) -> None:
    """Make a rename or a new entry in `directory` durable (a no-op where the OS cannot open folders)."""
    try:
        fd = os.open(str(directory), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def current_umask() -> int:
    """The process's umask, the permission bits a new file must not have.

    Linux reports it in /proc/self/status, read without touching the process. Elsewhere the only way to read it is
    to set it: os.umask(0) returns the old value, which is put back at once (a moment in which another thread
    creating a file would not be masked)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0)
    os.umask(old)
    return old


def write_atomic(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call `write(tmp)` to fill a temporary sibling of `path`, then move it over `path` atomically.

    For writers that want a file name (torch.save, safetensors' save_file, matplotlib's savefig). Returns `path`.
    The file gets the permissions of any new file (0666 less the umask), not mkstemp's private 0600.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        # after the writer: some (safetensors) replace the file they are given with one of their own
        os.chmod(tmp, 0o666 & ~current_umask())
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)
    return path


def write_bytes_atomic(path: str | Path, data: bytes) -> Path:
    """Write `data` to `path` atomically."""
    return write_atomic(path, lambda tmp: tmp.write_bytes(data))


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write `text` (UTF-8) to `path` atomically."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def json_safe(obj: Any) -> Any:
    """`obj` with every non-finite float replaced by the string "inf", "-inf" or "nan".

    JSON has no infinity (Python's json would write the invalid token `Infinity`), yet some results are infinite
    by definition, e.g. the samples needed to extract a suffix sampling can never emit. Strings keep them readable
    by any JSON parser and unmistakable; `float("inf")` reads them back.
    """
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {key: json_safe(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(value) for value in obj]
    return obj


def write_json_atomic(path: str | Path, obj: Any, *, indent: int = 2) -> Path:
    """Write `obj` as indented strict JSON to `path` (non-finite floats as strings, see `json_safe`)."""
    return write_text_atomic(path, json.dumps(json_safe(obj), indent=indent, allow_nan=False) + "\n")


def write_jsonl_atomic(path: str | Path, rows: Iterable[dict[str, Any]]) -> Path:
    """Write one compact strict-JSON object per line to `path` (non-finite floats as strings)."""
    return write_text_atomic(path, "".join(json.dumps(json_safe(row), allow_nan=False) + "\n" for row in rows))


def staging_directory(directory: str | Path) -> Path:
    """A fresh, empty staging sibling of `directory` (hidden name, this process's id) to fill before
    `replace_directory` publishes it."""
    directory = Path(directory)
    staging = directory.with_name(f".{directory.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return staging


def _owner_pid(sibling: Path) -> int | None:
    """The process id at the end of a staging or set-aside folder's name (".NAME.partial-PID", ".NAME.old-PID")."""
    tail = sibling.name.rpartition("-")[2]
    return int(tail) if tail.isdigit() else None


def process_gone(pid: int | None) -> bool:
    """True when no process `pid` runs on this machine (None, a name without a pid, counts as gone)."""
    if pid is None:
        return True
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return True
    except PermissionError:  # it exists, under another user
        return False
    return False


def _siblings(directory: Path, kind: str) -> list[Path]:
    """The ".NAME.<kind>-PID" folders beside `directory`, oldest first."""
    found = [p for p in directory.parent.glob(f".{glob.escape(directory.name)}.{kind}-*") if p.is_dir()]
    return sorted(found, key=lambda p: p.stat().st_mtime_ns)


def recover_directory(directory: str | Path) -> bool:
    """Undo a replace_directory cut off between its two renames: when `directory` is absent and the complete old
    folder it renamed aside is there, rename that back. Returns True when it did. Safe for any reader to call:
    a folder set aside by a process that still runs (in the middle of its replace) is left alone.

    Staging folders (".NAME.partial-PID") are never recovered: nothing vouches for their being complete."""
    directory = Path(directory)
    if directory.exists():
        return False
    aside = [p for p in _siblings(directory, "old") if _owner_pid(p) == os.getpid() or process_gone(_owner_pid(p))]
    if not aside:
        return False
    try:
        os.replace(aside[-1], directory)
    except OSError:  # another reader recovered it first
        return directory.exists()
    fsync_directory(directory.parent)
    return True


def remove_leftovers(directory: str | Path) -> list[Path]:
    """Remove what killed replace_directory calls for `directory` left beside it: staging folders
    (".NAME.partial-PID") and, once `directory` exists, old folders set aside (".NAME.old-PID"), of processes that
    are gone. Returns the folders removed."""
    directory = Path(directory)
    stale = [p for p in _siblings(directory, "partial") if process_gone(_owner_pid(p))]
    if directory.exists():
        stale += [p for p in _siblings(directory, "old") if process_gone(_owner_pid(p))]
    for folder in stale:
        shutil.rmtree(folder, ignore_errors=True)
    return stale


def replace_directory(staging: str | Path, directory: str | Path) -> Path:
    """Publish a fully written `staging` folder as `directory`, replacing an older one.

    The old folder is first renamed aside, then the staging folder renamed into place, then the old one removed:
    at every instant `directory` is either the complete old folder, absent for the moment between two renames
    (the old one still complete beside it), or the complete new folder. Its files get the permissions of any new
    file (0666 less the umask): some writers (safetensors) create theirs private (0600) whatever the umask.
    A `directory` that is a symbolic link is replaced at its target (`staging` must be on the target's file
    system), and the link is kept.
    """
    staging, directory = Path(staging), Path(directory)
    if directory.is_symlink():  # publish at the link's target: the link stays a link, the run lands where it points
        directory = Path(os.path.realpath(directory))
    mode = 0o666 & ~current_umask()
    for root, _, files in os.walk(staging):  # the contents must be on disk before the rename makes them visible
        for name in files:
            with open(os.path.join(root, name), "rb") as handle:
                os.fsync(handle.fileno())
                os.chmod(os.path.join(root, name), mode)
        fsync_directory(root)
    old = directory.with_name(f".{directory.name}.old-{os.getpid()}")
    if directory.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(directory, old)
    os.replace(staging, directory)
    fsync_directory(directory.parent)
    shutil.rmtree(old, ignore_errors=True)
    return directory
