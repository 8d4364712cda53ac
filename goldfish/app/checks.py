"""Checks a command makes before its work starts, so that bad input is one line (exit 2) instead of a traceback after
minutes of work or after partial output: the output folder can be written, `goldfish eval --out` holds no other
files (or, with --overwrite, is cleared of an earlier eval's), the extraction protocol fits the documents.

goldfish.app.validation runs them in each command's one validation pass; `check_extraction_fits` needs the loaded
documents and runs in goldfish eval's run, once they are.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

from eval.files import MEMBERSHIP_FILE

# Everything `goldfish eval` writes into its --out (goldfish.app.commands.eval.cmd_eval,
# goldfish.app.report.eval_figures): what --overwrite clears, so that no file of an earlier eval (e.g. train/beam.jsonl
# of a run with --beams) is left beside the new results.
EVAL_OUTPUTS = (
    "train",
    "heldout",
    "summary.json",
    "report.md",
    MEMBERSHIP_FILE,
    "headline.png",
    "rouge_hist.png",
    "divergence.png",
    "roc.png",
    "roc_loss.png",
    "auc.png",
    "breakdown_prefix.png",
    "breakdown_repeats.png",
)


def check_writable_folder(out: Path, flag: str = "--out") -> None:
    """Refuse `out` unless it is (or can be created as) a folder this process can write in: a path under a file,
    on a read-only filesystem or without permission is one line naming `flag`. Probes by creating and removing a
    file in the nearest existing folder (permission bits alone do not say whether a mount is read-only)."""
    out = Path(out)
    existing = out
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        where = "" if existing == out else f" ({existing} is a file)"
        raise ValueError(f"{flag} {out} cannot be a folder{where}. Fix: choose a folder for {flag}")
    try:
        descriptor, probe = tempfile.mkstemp(prefix=".goldfish-write-probe-", dir=existing)
        os.close(descriptor)
        os.unlink(probe)
    except OSError as error:
        raise ValueError(
            f"{flag} {out}: cannot write in {existing} ({error.strerror or error}). Fix: choose a folder you can "
            f"write to for {flag}"
        ) from None


def held_names(out: Path) -> list[str]:
    """The names in folder `out` (sorted) but its run lock; [] when it does not exist."""
    from goldfish.app.runlock import LOCK_FILE

    return sorted(p.name for p in out.iterdir() if p.name != LOCK_FILE) if out.is_dir() else []


def shown_names(held: list[str]) -> str:
    """The first four of `held`, comma-separated, for a one-line refusal."""
    return ", ".join(held[:4]) + (", ..." if len(held) > 4 else "")


def check_output_folder(out: Path, *, overwrite: bool, refusal: str, fix: str) -> None:
    """Check an `--out` that a command fills with its own files (eval, audit) before any work: a folder that can be
    written, empty but for a run lock unless --overwrite. `refusal` follows "is not empty (it holds ...)", `fix`
    follows "Fix: "."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder. Fix: choose a folder for --out")
    check_writable_folder(out)
    held = held_names(out)
    if held and not overwrite:
        raise ValueError(f"--out {out} is not empty (it holds {shown_names(held)}){refusal}. Fix: {fix}")


def check_eval_out(out: Path, *, overwrite: bool) -> None:
    """Check `goldfish eval --out` before any work: a folder that can be written, and empty unless --overwrite
    (`clear_eval_outputs` then removes an earlier eval's files once every other check has passed)."""
    check_output_folder(
        out,
        overwrite=overwrite,
        refusal="; refusing to mix this eval's files with them",
        fix="choose a new or empty --out, or --overwrite to replace the files of an earlier eval there (other files "
        "are kept)",
    )


def clear_eval_outputs(out: Path) -> None:
    """Remove what an earlier `goldfish eval` wrote into `out` (EVAL_OUTPUTS); other files are kept."""
    for name in EVAL_OUTPUTS:
        path = Path(out) / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def check_extraction_fits(
    parts: Mapping[str, Sequence[Any]], extraction: Any, prefix_lengths: Sequence[int] = ()
) -> None:
    """Refuse an extraction protocol (--suffix-len, --prefix-len) that no document of an evaluated part is long
    enough for, before the first result is written. `parts`: {part: documents with .token_ids}; `extraction`: an
    eval.extraction.ExtractionConfig. Some documents too short are skipped and counted, as documented; all is an
    error, for the extraction and for each of `prefix_lengths` (--prefix-lengths)."""
    need = extraction.min_tokens()
    for part, documents in parts.items():
        if documents and not any(len(doc.token_ids) >= need for doc in documents):
            longest = max(len(doc.token_ids) for doc in documents)
            raise ValueError(
                f"{extraction.requirement()}, and the {part} documents have at most {longest}. Fix: lower "
                "--suffix-len (and --prefix-len), or evaluate longer documents (--seq-len, or --extract-len with "
                "--pack)"
            )
    longest = max((len(doc.token_ids) for documents in parts.values() for doc in documents), default=None)
    too_long = [p for p in prefix_lengths if longest is not None and p + extraction.suffix_len > longest]
    if too_long:
        raise ValueError(
            f"--prefix-lengths {','.join(map(str, too_long))}: with --suffix-len {extraction.suffix_len} a document "
            f"needs {too_long[0] + extraction.suffix_len} tokens, and the evaluated documents have at most {longest}, "
            f"so every one would be skipped. Fix: prefix lengths of at most {longest - extraction.suffix_len}, or "
            "evaluate longer documents"
        )
