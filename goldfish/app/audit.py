"""`goldfish audit`: a released goldfish model against its own training mask (docs/audit.md).

    goldfish audit --model NAME_OR_FOLDER --mask SPEC --data DOCS [--nonmembers DOCS] --out DIR

Every document is tokenized as training tokenizes it (the tokenizer's bos id first, no other special tokens; cut to
--max-tokens as `goldfish train --seq-len` cuts; --append-eos as --pack lays documents out), the mask SPEC
(goldfish.app.config.parse_mask) marks the targets it dropped, and eval.audit measures kept vs dropped accuracy, the
gap, the longest reproduced span and greedy extraction per document, then the gap as a membership score against
--nonmembers. Writes OUT/audit.jsonl (one row per document), OUT/summary.json, OUT/report.md and OUT/gap_hist.png,
each atomically.

Every setting is checked before the model loads (one line, exit 2): the mask (standard and random masks have no fixed
dropped targets to audit), the folders, the documents and their lengths against h and the extraction split.
One process: --nproc and --grid are not offered (eval/parallel.py shards extraction and membership, not this pass).
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from goldfish.app import options as opt
from goldfish.app.argparsing import argument_type, non_negative_int, positive_int
from goldfish.app.config import MaskSpec, Runtime, parse_mask

if TYPE_CHECKING:
    from eval.config import ExtractionConfig

AUDIT_FILE = "audit.jsonl"
GAP_FIGURE = "gap_hist.png"
OUTPUTS = (AUDIT_FILE, "summary.json", "report.md", GAP_FIGURE)  # what --overwrite clears
MASKS_PAGE = "docs/masks.md"


@dataclass(frozen=True)
class AuditDocument:
    """A document as the audit scores it: its id, text and token ids (bos first, as training tokenizes)."""

    id: str
    text: str
    token_ids: list[int]


@dataclass
class DocumentSet:
    """One side of the audit (members or non-members): where it came from and what was kept of it."""

    source: str
    documents: list[AuditDocument]
    n_loaded: int
    too_short: list[str] = field(default_factory=list)

    def record(self, least: int) -> dict[str, Any]:
        return {
            "source": self.source,
            "n_loaded": self.n_loaded,
            "n_audited": len(self.documents),
            "n_too_short": len(self.too_short),
            "too_short": self.too_short[:50],
            "min_tokens": least,
        }


# ----- settings -------------------------------------------------------------------------------------------------


def audit_mask(text: str) -> MaskSpec:
    """--mask SPEC as a MaskSpec, refusing what cannot be audited (ValueError naming the option and the fix)."""
    try:
        mask = parse_mask(text)
    except ValueError as error:
        raise ValueError(
            f"--mask {text}: {error}. Fix: give the mask the model was trained with, e.g. hashed:4:13 (see "
            f"{MASKS_PAGE})"
        ) from None
    if mask.strategy is None:
        raise ValueError(
            f"--mask {text}: the standard loss drops no target, so there is nothing to audit. Fix: give the goldfish "
            f"mask the model was trained with, e.g. hashed:4:13 (see {MASKS_PAGE})"
        )
    if mask.strategy == "random":
        raise ValueError(
            f"--mask {text}: a random mask is drawn afresh at every step, so no fixed set of dropped targets exists "
            "to audit. Fix: audit a model trained with a deterministic mask (hashed, hashed-reference, static)"
        )
    return mask


def _uses_window(mask: MaskSpec) -> bool:
    """Whether the mask decides a target from the h targets ending at it (goldfish.strategies.WINDOW_STRATEGIES)."""
    from goldfish.strategies import WINDOW_STRATEGIES

    return mask.strategy in WINDOW_STRATEGIES


def _check_out(out: Path, overwrite: bool) -> None:
    """--out: a folder that can be written, empty (but for a run lock) unless --overwrite."""
    from goldfish.app.checks import check_output_folder

    check_output_folder(
        out,
        overwrite=overwrite,
        refusal="",
        fix="choose a new or empty --out, or --overwrite to replace an earlier audit's files there (other files are "
        "kept)",
    )


def _clear_outputs(out: Path) -> None:
    for name in OUTPUTS:
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def _same_source(a: str, b: str) -> bool:
    if a == b:
        return True
    pa, pb = Path(os.path.expanduser(a)), Path(os.path.expanduser(b))
    return pa.exists() and pb.exists() and pa.resolve() == pb.resolve()


def _refuse_model_name(model: str) -> None:
    """A tiny architecture name (random init, nothing trained) is no model to audit."""
    from goldfish.app.models import is_tiny_model

    if is_tiny_model(model):
        raise ValueError(
            f"--model {model} is an architecture built at random init, not a trained model. Fix: give a model folder "
            "(e.g. a goldfish train run's OUT/checkpoint), a hub name or a .gguf file"
        )
    path = Path(os.path.expanduser(model))
    looks_local = model.startswith((".", "/", "~")) or model.count("/") > 1 or model.endswith(".gguf")
    if looks_local and not path.exists():
        raise ValueError(f"--model {model}: no such folder or file. Fix: check the path, or give a hub name (ORG/NAME)")


def _load_tokenizer(model: str, tokenizer: str | None) -> Any:
    import data
    from goldfish.app.pretrained import load_gguf_tokenizer, resolve_gguf

    try:
        if tokenizer is not None:
            return data.load_tokenizer(tokenizer)
        gguf = resolve_gguf(model)
        if gguf is not None:
            if not gguf.is_file():
                raise ValueError(f"--model {model}: no such file. Fix: give an existing .gguf file")
            return load_gguf_tokenizer(gguf)
        return data.load_tokenizer(model)
    except ValueError as error:  # the hub's messages run over several lines: one line, as every settings error
        raise ValueError(" ".join(str(error).split())) from None


def tokenize_documents(
    documents: Sequence[Any], tokenizer: Any, *, max_tokens: int = 0, append_eos: bool = False
) -> list[AuditDocument]:
    """Token ids as training builds them: the tokenizer's bos id (when it has one) then the text's ids, no other
    special tokens; the first `max_tokens` of those (0: all), as `goldfish train --seq-len` cuts a document; then the
    eos id with `append_eos` (how --pack lays a document out)."""
    bos, eos = getattr(tokenizer, "bos_token_id", None), getattr(tokenizer, "eos_token_id", None)
    if append_eos and eos is None:
        raise ValueError("--append-eos: the tokenizer has no eos token. Fix: leave --append-eos out")
    texts = [d.text for d in documents]
    encoded = tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"] if texts else []
    out = []
    for doc, ids in zip(documents, encoded):
        token_ids = ([bos] if bos is not None else []) + [int(t) for t in ids]
        if max_tokens:
            token_ids = token_ids[:max_tokens]
        if append_eos:
            token_ids.append(int(eos))
        out.append(AuditDocument(str(doc.id), doc.text, token_ids))
    return out


def load_set(source: str, args: argparse.Namespace, tokenizer: Any, least: int) -> DocumentSet:
    """The documents of --data or --nonmembers, tokenized, those shorter than `least` tokens set aside."""
    import data

    loaded = data.load_documents(source, text_field=args.text_field, id_field=args.id_field, split=args.split)
    if args.max_docs:
        loaded = loaded[: args.max_docs]
    tokenized = tokenize_documents(loaded, tokenizer, max_tokens=args.max_tokens, append_eos=args.append_eos)
    kept = [d for d in tokenized if len(d.token_ids) >= least]
    return DocumentSet(str(source), kept, len(loaded), [d.id for d in tokenized if len(d.token_ids) < least])


def _least_tokens(mask: MaskSpec) -> int:
    """Tokens a document needs for the mask to be able to drop a target: h + 1 for a hashed window (h targets),
    2 otherwise (one target)."""
    return mask.h + 1 if _uses_window(mask) else 2


def _check_set(docs: DocumentSet, what: str, mask: MaskSpec, spec_text: str, least: int) -> None:
    if docs.documents:
        return
    if not docs.too_short:
        raise ValueError(f"{what} {docs.source}: no documents. Fix: give a file with at least one document")
    why = (
        f"the mask {spec_text} decides a target from the h = {mask.h} targets ending at it, so a document needs at "
        f"least {least} tokens for any target to be dropped"
        if _uses_window(mask)
        else f"a document needs at least {least} tokens"
    )
    raise ValueError(
        f"{what} {docs.source}: all {len(docs.too_short)} document(s) are shorter than {least} tokens: {why}. Fix: "
        "give longer documents (or a larger --max-tokens), or check --mask"
    )


def _check_extraction(members: DocumentSet, extraction: ExtractionConfig) -> None:
    longest = max(len(d.token_ids) for d in members.documents)
    if longest < extraction.min_tokens():
        raise ValueError(
            f"{extraction.requirement()}, and the --data documents have at most {longest}. Fix: lower --suffix-len "
            "(and --prefix-len)"
        )


def _check_disjoint(members: DocumentSet, nonmembers: DocumentSet) -> None:
    texts = {d.text for d in members.documents}
    shared = [d.id for d in nonmembers.documents if d.text in texts]
    if shared:
        raise ValueError(
            f"{len(shared)} of the --nonmembers documents are also in --data (first: {shared[0]!r}): a document cannot "
            "be both. Fix: give non-members the model never trained on"
        )


# ----- the command ----------------------------------------------------------------------------------------------


def cmd_audit(args: argparse.Namespace) -> int:
    from eval.config import ExtractionConfig
    from goldfish.app.runlock import out_lock

    runtime = Runtime(**opt.RUNTIME.values(args))
    mask = audit_mask(args.mask)
    extraction = ExtractionConfig(**opt.EXTRACTION.values(args, skip={"batch_size"}), batch_size=args.batch_size)
    out = Path(args.out)
    _check_out(out, args.overwrite)
    if args.nonmembers is not None and _same_source(args.data, args.nonmembers):
        raise ValueError(
            f"--nonmembers {args.nonmembers} is the --data source: members and non-members must be different "
            "documents. Fix: give documents the model never trained on as --nonmembers"
        )
    _refuse_model_name(args.model)
    from goldfish.app.pretrained import recover_folder

    recover_folder(args.model)  # a checkpoint a killed save set aside is complete: put it back
    tokenizer = _load_tokenizer(args.model, args.tokenizer)
    least = _least_tokens(mask)
    members = load_set(args.data, args, tokenizer, least)
    _check_set(members, "--data", mask, args.mask, least)
    _check_extraction(members, extraction)
    nonmembers = None
    if args.nonmembers is not None:
        nonmembers = load_set(args.nonmembers, args, tokenizer, least)
        _check_set(nonmembers, "--nonmembers", mask, args.mask, least)
        _check_disjoint(members, nonmembers)
    with out_lock(out):
        _check_out(out, args.overwrite)  # again under the lock: another run may have written meanwhile
        if args.overwrite:
            _clear_outputs(out)
        summary = run_audit(args, mask, extraction, runtime, tokenizer, members, nonmembers, out, least)
    line = _headline(summary)
    print(line)
    print(f"wrote {out}/report.md, {out}/summary.json, {out}/{AUDIT_FILE} and {out}/{GAP_FIGURE}")
    return 0


def _load_model(model_name: str, tokenizer: Any) -> Any:
    from goldfish.app.pretrained import DEFAULT_MODEL_CACHE, load_pretrained, load_pretrained_model, resolve_gguf

    if resolve_gguf(model_name) is not None:
        model, _ = load_pretrained(model_name, cache_dir=DEFAULT_MODEL_CACHE)
    else:
        model = load_pretrained_model(model_name)
    vocab = model.get_input_embeddings().num_embeddings
    if vocab < len(tokenizer):
        raise ValueError(
            f"the tokenizer has {len(tokenizer)} tokens but model {model_name!r} embeds only {vocab}. Fix: audit with "
            "the model's own tokenizer (leave --tokenizer out)"
        )
    return model


def run_audit(
    args: argparse.Namespace,
    mask: MaskSpec,
    extraction: ExtractionConfig,
    runtime: Runtime,
    tokenizer: Any,
    members: DocumentSet,
    nonmembers: DocumentSet | None,
    out: Path,
    least: int,
) -> dict[str, Any]:
    """Load the model, audit both sets, write the outputs; returns the summary."""
    from data.atomic import write_json_atomic, write_jsonl_atomic
    from eval.audit import audit_documents, audit_summary, score_windows
    from goldfish.app.prepare import pad_token_id

    started = time.perf_counter()
    model = _load_model(args.model, tokenizer).to(runtime.torch_device()).eval()
    loaded = time.perf_counter()
    context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if args.window_stride is not None and context is not None:
        score_windows(context + 1, context, args.window_stride)  # refuses a stride the context cannot take
    special = sorted(set(tokenizer.all_special_ids))

    def dropped(targets: Any) -> Any:
        return mask.dropped(targets, special)

    def decided(targets: Any) -> Any:
        """The targets the mask decides on: not the ignore index, not a special token, and for a hashed window
        not the first h - 1 (they have no full window and are kept by every mask of that width)."""
        import torch

        from conventions import IGNORE_INDEX

        out = (targets != IGNORE_INDEX) & ~torch.isin(targets, torch.tensor(special, dtype=targets.dtype))
        if _uses_window(mask):
            out[:, : mask.h - 1] = False
        return out

    common = dict(
        dropped_fn=dropped,
        decided_fn=decided,
        decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
        pad_token_id=pad_token_id(tokenizer),
        extraction=extraction,
        context=context,
        stride=args.window_stride,
        progress=runtime.progress,
    )
    member_rows = audit_documents(model, members.documents, member=True, **common)
    nonmember_rows = audit_documents(model, nonmembers.documents, member=False, **common) if nonmembers else None
    audited = time.perf_counter()
    summary: dict[str, Any] = {
        "command": "audit",
        "model": args.model,
        "mask": {"spec": args.mask, "label": mask.label, **asdict(mask)},
        "special_token_ids": special,
        "tokenization": {
            "bos_first": getattr(tokenizer, "bos_token_id", None) is not None,
            "max_tokens": args.max_tokens,
            "append_eos": args.append_eos,
        },
        "context": context,
        "window_stride": args.window_stride if args.window_stride is not None else (context // 2 if context else None),
        "extraction": asdict(extraction),
        "documents": {
            "members": members.record(least),
            "nonmembers": nonmembers.record(least) if nonmembers else None,
        },
        **audit_summary(member_rows, nonmember_rows, k=mask.k, n_resamples=extraction.bootstrap),
    }
    summary["timings_s"] = {"load_model": loaded - started, "audit": audited - loaded}
    write_jsonl_atomic(out / AUDIT_FILE, member_rows + (nonmember_rows or []))
    figures = draw_gap_histogram(summary, out / GAP_FIGURE)
    write_json_atomic(out / "summary.json", summary)
    from data.atomic import write_text_atomic

    write_text_atomic(out / "report.md", render_report(summary, figures))
    return summary


# ----- report ---------------------------------------------------------------------------------------------------


def _headline(summary: Mapping[str, Any]) -> str:
    from eval.metrics import AUC, AUC_CI
    from goldfish.app.report_format import fmt, fmt_ci

    parts = []
    for side in ("members", "nonmembers"):
        group = summary.get(side)
        if group:
            parts.append(
                f"{side}: kept {fmt(group['kept_accuracy']['mean'])} / dropped {fmt(group['dropped_accuracy']['mean'])}"
                f", gap {fmt_ci(group['gap']['mean'], group['gap']['ci'])}"
            )
    membership = summary.get("membership")
    if membership and "mask_gap" in membership["attacks"]:
        attack = membership["attacks"]["mask_gap"]
        parts.append(f"gap as membership score: AUC {fmt_ci(attack[AUC], attack[AUC_CI])}")
    return "audit " + "; ".join(parts)


def draw_gap_histogram(summary: Mapping[str, Any], path: Path) -> list[str]:
    """The histogram of per-document gaps, members against non-members; returns [its file name]."""
    import numpy as np

    from goldfish.app.report_format import new_figure, save_figure

    figure, axis = new_figure(figsize=(6.4, 3.6))
    bins = np.linspace(-1.0, 1.0, 41)
    for side, label, color in (("members", "members", "C0"), ("nonmembers", "non-members", "C1")):
        group = summary.get(side)
        if group and group["gaps"]:
            axis.hist(group["gaps"], bins=bins, alpha=0.6, color=color, label=f"{label} ({len(group['gaps'])})")
    axis.axvline(0.0, color="grey", linewidth=0.8)
    axis.set_xlabel("gap = kept accuracy - dropped accuracy (per document)")
    axis.set_ylabel("documents")
    axis.set_title(f"{summary['model']} against mask {summary['mask']['spec']}", fontsize=9)
    axis.legend()
    save_figure(figure, path)
    return [path.name]


def render_report(summary: Mapping[str, Any], figures: Sequence[str] = ()) -> str:
    """report.md of an audit, from its summary."""
    from eval.metrics import AUC, AUC_CI, EXACT_MATCH, TPR_AT_FPR, TPR_AT_FPR_CI, interval_key
    from goldfish.app.report_format import fmt, fmt_ci, md_table

    mask = summary["mask"]
    lines = [
        "# goldfish audit",
        "",
        f"Model `{summary['model']}` against mask `{mask['spec']}` ({mask['label']}, k = {mask['k']}, "
        f"h = {mask['h']}); context {summary['context']} tokens, windows every "
        f"{summary['window_stride']} tokens past it.",
        "",
    ]
    docs = summary["documents"]
    for side, name in (("members", "--data (members)"), ("nonmembers", "--nonmembers")):
        record = docs.get(side)
        if record:
            skipped = (
                f", {record['n_too_short']} shorter than {record['min_tokens']} tokens skipped"
                if record["n_too_short"]
                else ""
            )
            lines.append(
                f"- {name}: {record['n_audited']} of {record['n_loaded']} documents from `{record['source']}` audited"
                + skipped
            )
    lines += ["", "## Kept vs dropped targets (teacher-forced)", ""]
    header = [
        "documents",
        "n",
        "kept accuracy",
        "dropped accuracy",
        "gap",
        "docs with gap > 0",
        "kept loss",
        "dropped loss",
        "longest span",
    ]
    rows = []
    for side, name in (("members", "members"), ("nonmembers", "non-members")):
        group = summary.get(side)
        if not group:
            continue
        rows.append(
            [
                name,
                str(group["n_docs"]),
                fmt_ci(group["kept_accuracy"]["mean"], group["kept_accuracy"]["ci"]),
                fmt_ci(group["dropped_accuracy"]["mean"], group["dropped_accuracy"]["ci"]),
                fmt_ci(group["gap"]["mean"], group["gap"]["ci"]),
                f"{group['n_gap_above_zero']} / {group['n_with_gap']}",
                fmt(group["kept_loss"]["mean"]),
                fmt(group["dropped_loss"]["mean"]),
                fmt(group["longest_span"]["mean"]),
            ]
        )
    lines += md_table(header, rows)
    lines += [
        "Means over documents with 95% bootstrap intervals over documents; a document counts under "
        '"gap > 0" when its own interval (over its positions) lies above 0. Losses in nats per target.',
        "",
        "## Greedy extraction and where it diverges",
        "",
    ]
    rows = []
    for side, name in (("members", "members"), ("nonmembers", "non-members")):
        group = summary.get(side)
        if not group:
            continue
        ext, div = group["extraction"], group["divergence"]
        rows.append(
            [
                name,
                f"{ext[f'n_{EXACT_MATCH}']} / {ext['n_docs']}",
                fmt_ci(ext[EXACT_MATCH], ext[interval_key(EXACT_MATCH)]),
                str(div.get("n_diverged", 0)),
                fmt_ci(div.get("share_on_dropped"), div.get("share_on_dropped_ci")),
                fmt(div.get("share_expected_by_chance")),
                fmt(div["base_rate"]),
                fmt(div.get("p_value")),
            ]
        )
    lines += md_table(
        [
            "documents",
            "exact match",
            "share",
            "diverged",
            "first divergence on a dropped target",
            "expected by chance",
            "1/k",
            "p (binomial)",
        ],
        rows,
    )
    membership = summary.get("membership")
    if membership:
        lines += ["## The gap as a membership score", ""]
        rows = [
            [
                name,
                fmt_ci(attack[AUC], attack[AUC_CI]),
                fmt_ci(attack[TPR_AT_FPR]["0.01"], attack[TPR_AT_FPR_CI]["0.01"]),
                f"{attack['n_members']} / {attack['n_nonmembers']}",
            ]
            for name, attack in membership["attacks"].items()
        ]
        lines += md_table(["score", "AUC", "TPR at 1% FPR", "members / non-members"], rows)
        lines += [
            "mask_gap: kept accuracy - dropped accuracy; mask_loss_gap: dropped loss - kept loss; loss, zlib, min_k: "
            "the loss-based attacks (docs/membership.md).",
            "",
        ]
    else:
        lines += ["No --nonmembers: the gap is not compared with documents the model never saw.", ""]
    for name in figures:
        lines += [f"![per-document gaps, members vs non-members]({name})", ""]
    lines += [
        "A gap on a document shows the model was trained on it with this mask; no gap does not show that it was not "
        "(too few repetitions to memorize, another mask, another tokenization). See docs/audit.md.",
        "",
        f"Files: `{AUDIT_FILE}` (one row per document), `summary.json`.",
        "",
    ]
    return "\n".join(lines)


# ----- the parser -----------------------------------------------------------------------------------------------


def add_audit_parser(sub: Any) -> None:
    """Register `goldfish audit` on the subcommands `sub` of the goldfish parser."""
    from eval.config import ExtractionConfig

    audit = sub.add_parser("audit", help="audit a goldfish model against its own mask: kept vs dropped accuracy")
    audit.add_argument(
        "--model", required=True, help="an HF model folder (e.g. OUT/checkpoint), a hub name or a .gguf file"
    )
    audit.add_argument(
        "--mask",
        required=True,
        help=f"the mask the model was trained with, STRATEGY:K:H (e.g. hashed:4:13, static:4; {MASKS_PAGE} lists the "
        "released models' masks); standard and random are refused",
    )
    audit.add_argument("--data", required=True, help="the documents to audit (members): .jsonl, .txt, .parquet, ...")
    audit.add_argument("--nonmembers", default=None, help="documents the model never trained on, for the AUC")
    audit.add_argument("--out", required=True, help="output folder (new or empty, unless --overwrite)")
    audit.add_argument(
        "--overwrite", action="store_true", help="replace an earlier audit's files in --out (other files are kept)"
    )
    audit.add_argument("--text-field", default="text", help="record field holding the text (default: %(default)s)")
    audit.add_argument("--id-field", default=None, help="record field holding a document id (default: file:line)")
    audit.add_argument("--split", default="train", help="dataset split for HF datasets (default: %(default)s)")
    audit.add_argument("--tokenizer", default=None, help="tokenizer folder or name (default: the model's own)")
    audit.add_argument(
        "--max-docs", type=argument_type(non_negative_int), default=0, help="first N documents of each set (0: all)"
    )
    audit.add_argument(
        "--max-tokens",
        type=argument_type(non_negative_int),
        default=0,
        help="cut each document to its first N tokens, bos counted, as goldfish train --seq-len N does (0: whole)",
    )
    audit.add_argument(
        "--append-eos", action="store_true", help="end each document with the eos token (as --pack trains documents)"
    )
    audit.add_argument(
        "--window-stride",
        type=argument_type(positive_int),
        default=None,
        help="documents longer than the model's context are scored in windows ending this many tokens apart "
        "(default: half the context)",
    )
    audit.add_argument(
        "--batch-size", type=argument_type(positive_int), default=8, help="sequences per forward (default: %(default)s)"
    )
    opt.EXTRACTION.add_to(audit, ExtractionConfig(), skip={"batch_size"})
    opt.RUNTIME.add_to(audit, Runtime(), skip={"grid", "nproc", "report_to", "verify"})
    audit.set_defaults(func=cmd_audit)
