"""eval.parallel: sharded evaluation on an engine-parallel model equals one process.

Reference: the eval/ functions run in this (test) process on the serial model. Workers parallelize the same tiny
Llama (random init, fixed seed, float64) on grids of 2 and 4 gloo ranks, evaluate 7 documents of different
lengths (one too short, so shards are uneven), and rank 0's rows and summaries must match the serial ones.

Tolerances: generated ids, sampled ids, exact-match flags and ROUGE (computed from ids) must be EQUAL. Float
quantities (teacher-forced accuracies, log q, membership losses and scores) are compared at rel 1e-5: the models run
in float64, but HF's LlamaRMSNorm normalizes in float32 even for float64 inputs, so both carry float32 rounding
(~6e-8 relative) and tensor parallelism adds partial products in another order, which can move a float32 rounding:
differences stay near 1e-7 relative. 1e-5 leaves margin and still catches a wrong row, token or document (which
changes these values by 1e-2 or more). Argmax-based values (generated ids, accuracies) could in principle flip on a
near-tie of two logits; with this seed no logit gap is that small, and the comparison is deterministic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from distributed import run_distributed

from engine.core.sharding import run_sharded, shard, shard_bounds
from eval.adaptive import (
    SamplingConfig,
    beam_extract,
    probabilistic_extract,
    sampling_extract,
    summarize_beam,
    summarize_probabilistic,
    summarize_sampling,
)
from eval.extraction import ExtractionConfig, extract, summarize_extraction
from eval.membership import membership_rows, membership_summary, recall_prefix, token_frequencies
from goldfish.app.models import load_parallel_model
from goldfish.app.weights_folder import rank0_first

VOCAB = 256
PAD = 1  # not 0: transformers 5.x beam search reads pad_token_id=0 as "no pad id" and fails without an EOS id
CONFIG = ExtractionConfig(suffix_len=6, batch_size=2)  # several batches per shard
LENGTHS = (30, 12, 4, 21, 9, 17, 26)  # the 4-token document is too short for a 6-token suffix
SAMPLING = SamplingConfig(temperature=1.0, top_p=0.9, n_samples=3, seed=5)
TOLERANCE = {"rel": 1e-5, "abs": 1e-9}
FREQUENCIES = token_frequencies([[i % 7 + 2 for i in range(50)], list(range(VOCAB))], VOCAB)  # DC-PDD's reference


@dataclass(frozen=True)
class Doc:
    id: str
    token_ids: list[int]


def llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        vocab_size=VOCAB,
        intermediate_size=128,
        max_position_embeddings=64,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).double().eval()


def documents(lengths: tuple[int, ...] = LENGTHS) -> list[Doc]:
    gen = torch.Generator().manual_seed(7)
    return [Doc(f"doc{i}", torch.randint(2, VOCAB, (n,), generator=gen).tolist()) for i, n in enumerate(lengths)]


def decode(ids: list[int]) -> str:
    return " ".join(f"w{i}" for i in ids)


def every_third_dropped(targets: torch.Tensor) -> torch.Tensor:
    """A static goldfish-style mask: drop target positions 0, 3, 6, ..."""
    positions = torch.arange(targets.shape[-1])
    return (positions % 3 == 0).expand_as(targets).clone()


def serial_results(docs: list[Doc]) -> dict[str, Any]:
    """Every instrument in one process: the reference."""
    model, reference = llama(0), llama(1)
    members, nonmembers = docs[:4], docs[4:]
    prefix, prefix_ids = recall_prefix(nonmembers, 1)
    options = dict(
        decode=decode,
        pad_token_id=PAD,
        reference_model=reference,
        batch_size=2,
        recall_prefix_ids=prefix,
        frequencies=FREQUENCIES,
    )
    member_rows = membership_rows(model, members, member=True, **options)
    nonmember_rows = membership_rows(model, nonmembers, member=False, **options)
    for key in ("score_recall", "recall_loss", "recall_n_scored"):  # the prefix document is not scored by ReCaLL
        nonmember_rows[0].pop(key)
    nonmember_rows[0]["recall_prefix"] = True
    notes = {
        "recall": {
            "prefix_documents": prefix_ids,
            "prefix_tokens": len(prefix),
            "note": "the non-member prefix is these held-out documents' tokens, concatenated; they are "
            "not scored by ReCaLL",
        }
    }
    return {
        "extract": extract(
            model, docs, CONFIG, decode=decode, pad_token_id=PAD, drop_mask_fn=every_third_dropped, progress=False
        ),
        "probabilistic": probabilistic_extract(model, docs, CONFIG, temperature=0.8, top_p=0.9, pad_token_id=PAD),
        "beam": beam_extract(model, docs, CONFIG, num_beams=3, pad_token_id=PAD, decode=decode),
        "sampling": sampling_extract(model, docs, CONFIG, SAMPLING, pad_token_id=PAD, keep_samples=True),
        "membership": (
            member_rows + nonmember_rows,
            membership_summary(member_rows, nonmember_rows, min_k=0.2, notes=notes),
        ),
    }


def parallel_results(shape: tuple[int, int, int, int], docs: list[Doc]) -> dict[str, Any] | None:
    """Every instrument through eval.parallel on one grid: rank 0's results, None on the others (checked)."""
    from engine import init
    from eval.parallel import (
        beam_parallel,
        evaluate_parallel,
        membership_parallel,
        parallelize_for_eval,
        probabilistic_parallel,
        sampling_parallel,
    )

    grid = init(*shape)
    try:
        model = parallelize_for_eval(llama(0), grid)
        reference = parallelize_for_eval(llama(1), grid)
        out = {
            "extract": evaluate_parallel(
                model, docs, CONFIG, grid, decode=decode, pad_token_id=PAD, drop_mask_fn=every_third_dropped
            ),
            "probabilistic": probabilistic_parallel(
                model, docs, CONFIG, grid, temperature=0.8, top_p=0.9, pad_token_id=PAD
            ),
            "beam": beam_parallel(model, docs, CONFIG, grid, num_beams=3, pad_token_id=PAD, decode=decode),
            "sampling": sampling_parallel(model, docs, CONFIG, SAMPLING, grid, pad_token_id=PAD, keep_samples=True),
            "membership": membership_parallel(
                model,
                docs[:4],
                docs[4:],
                grid,
                decode=decode,
                pad_token_id=PAD,
                reference_model=reference,
                batch_size=2,
                min_k=0.2,
                frequencies=FREQUENCIES,
            ),
        }
    finally:
        grid.close()
    if grid.rank != 0:
        assert all(value == (None, None) for value in out.values()), f"rank {grid.rank} got results"
        return None
    return out


def assert_close(got: Any, expected: Any, where: str = "") -> None:
    """Equal structure; floats within TOLERANCE (and inf/None where the reference has them); the rest equal."""
    if isinstance(expected, dict):
        assert isinstance(got, dict) and list(got) == list(expected), f"{where}: keys {list(got)} != {list(expected)}"
        for key in expected:
            assert_close(got[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(expected), f"{where}: {got} != {expected}"
        for i, (g, e) in enumerate(zip(got, expected)):
            assert_close(g, e, f"{where}[{i}]")
    elif isinstance(expected, float) and not isinstance(got, bool):
        if math.isinf(expected):
            assert got == expected, f"{where}: {got} != {expected}"
        else:
            assert got == pytest.approx(expected, **TOLERANCE), f"{where}: {got} != {expected}"
    else:
        assert got == expected, f"{where}: {got!r} != {expected!r}"


def check_against_serial(got: dict[str, Any], expected: dict[str, Any], shape: tuple[int, ...]) -> None:
    """Every instrument, the gradient-norm attack included on tensor-parallel grids, as one process gives it."""
    for name, (rows, summary) in expected.items():
        assert_close(got[name][0], rows, f"{shape} {name} rows")
        assert_close(got[name][1], summary, f"{shape} {name} summary")


# ----- one process: summaries from rows, shards ---------------------------------------------------------------------


def test_summaries_recomputed_from_rows_equal_the_functions_summaries() -> None:
    model, docs = llama(0), documents()
    rows, summary = extract(model, docs, CONFIG, decode=decode, pad_token_id=PAD, progress=False)
    assert summary["skipped_ids"] == ["doc2"] and summary["n_docs"] == 6
    assert summarize_extraction(rows, ["doc2"], CONFIG) == summary
    rows, summary = probabilistic_extract(
        model, docs, CONFIG, temperature=0.8, pad_token_id=PAD, confidences=(0.5,), budgets=(1, 7)
    )
    assert summarize_probabilistic(rows, ["doc2"], CONFIG, 0.8, 1.0, (0.5,), (1, 7)) == summary
    rows, summary = beam_extract(model, docs[:3], CONFIG, num_beams=2, pad_token_id=PAD, decode=decode)
    assert summarize_beam(rows, ["doc2"], CONFIG, 2) == summary
    rows, summary = sampling_extract(model, docs[:3], CONFIG, SamplingConfig(n_samples=2), pad_token_id=PAD)
    assert summarize_sampling(rows, ["doc2"], CONFIG, SamplingConfig(n_samples=2)) == summary


def test_empty_rows_summaries() -> None:
    assert summarize_extraction([], [], CONFIG)["exact_match"] is None
    assert summarize_probabilistic([], ["a"], CONFIG)["n_skipped_too_short"] == 1
    assert summarize_sampling([], [], CONFIG, SAMPLING)["sample_exact_rate"] is None


def test_shard_bounds_are_contiguous_balanced_and_cover_everything() -> None:
    for n_items in range(0, 12):
        for n_shards in range(1, 6):
            bounds = [shard_bounds(n_items, n_shards, i) for i in range(n_shards)]
            assert bounds[0][0] == 0 and bounds[-1][1] == n_items
            assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
            sizes = [end - start for start, end in bounds]
            assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    assert shard_bounds(7, 2, 0) == (0, 4) and shard_bounds(7, 2, 1) == (4, 7)
    assert shard_bounds(1, 2, 1) == (1, 1)
    with pytest.raises(ValueError, match="block 2 of 5 items in 2 blocks"):
        shard_bounds(5, 2, 2)


def test_one_process_without_a_grid() -> None:
    assert shard([1, 2, 3], None) == [1, 2, 3]
    assert run_sharded(lambda block: [x * 10 for x in block], [1, 2, 3], None) == [10, 20, 30]
    with pytest.raises(ValueError, match="tiny model built at random init"):
        load_parallel_model("micro-llama", None)


# ----- several processes ----------------------------------------------------------------------------------------------


def _fails_on_data_rank_1(block: list[int]) -> list[int]:
    if block and block[0] >= 2:  # items [0, 1, 2, 3] on data=2: the block [2, 3] is data rank 1's
        raise KeyError("document 2 is broken")
    return block


def _world_2(expected: dict[str, Any], docs: list[Doc], folder: str) -> dict[str, Any]:
    """Every world-2 grid against the serial results, plus the edge cases: fewer documents than data ranks, no
    documents, extraction with prompts fed one column per forward on x=2, an error on one rank, the row split
    inside ParallelEvalModel, generate's fixed-length rule, and a plain (not parallelized) model on a grid with
    tensor-parallel axes."""
    from unittest import mock

    from engine import init
    from engine.core.sharding import ShardedRunError as ParallelEvalError
    from eval import decoding
    from eval.parallel import ParallelEvalModel, eval_model, evaluate_parallel, parallelize_for_eval

    for shape in ((2, 1, 1, 1), (1, 2, 1, 1), (1, 1, 2, 1), (1, 1, 1, 2)):
        got = parallel_results(shape, docs)
        if got is not None:
            check_against_serial(got, expected, shape)
    notes: dict[str, Any] = {}
    grid = init(data=2)
    model = parallelize_for_eval(llama(0), grid)
    for n_docs in (1, 0):
        rows, summary = evaluate_parallel(model, docs[:n_docs], CONFIG, grid, decode=decode, pad_token_id=PAD)
        if grid.rank == 0:
            notes[f"{n_docs} docs"] = (rows, summary)
    try:
        run_sharded(_fails_on_data_rank_1, [0, 1, 2, 3], grid)
    except ParallelEvalError as error:
        notes["error"] = str(error)
    grid.close()
    grid = init(x=2)
    model = ParallelEvalModel(load_parallel_model(folder, grid, dtype=torch.float64), grid)
    notes["loaded in eval mode"] = not model.training
    with mock.patch.object(decoding, "PREFILL_TOKENS", 3):  # batches of 2 rows: prompts go 1 column per forward
        chunked = evaluate_parallel(
            model, docs, CONFIG, grid, decode=decode, pad_token_id=PAD, drop_mask_fn=every_third_dropped
        )
    if grid.rank == 0:
        notes["chunked prefill"] = chunked
    marker = Path(folder) / "rank0.txt"
    notes["rank 0 first"] = rank0_first(grid, lambda: marker.write_text("0") if grid.rank == 0 else marker.read_text())
    notes["rank 0 found none"] = rank0_first(grid, lambda: None if grid.rank == 0 else "loaded")  # the ranks agree
    try:
        rank0_first(grid, lambda: [][grid.rank])  # fails on rank 0: every rank raises, rank 1 does not load
    except ParallelEvalError as error:
        notes["rank 0 failed"] = str(error)
    seen: list[int] = []
    hook = model.model.model.embed_tokens.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[0]))
    ids = torch.tensor([docs[i].token_ids[:9] for i in (0, 1, 3)])
    logits = model(input_ids=ids).logits
    hook.remove()
    notes["rows fed"] = seen
    notes["logits"] = logits.tolist()  # plain lists: tensors cannot leave a finished worker
    try:
        model.generate(input_ids=ids, max_new_tokens=2)
    except ValueError as error:
        notes["generate"] = str(error)
    plain = llama(0)
    notes["plain model used as is"] = eval_model(plain, grid) is plain  # every rank computes the whole batch
    try:
        ParallelEvalModel(plain, grid)
    except ValueError as error:
        notes["plain model wrapped"] = str(error)
    grid.close()
    return notes


def test_world_2_grids_equal_one_process(tmp_path: Path) -> None:
    docs = documents()
    expected = serial_results(docs)
    llama(0).save_pretrained(tmp_path)
    notes = run_distributed(2, _world_2, expected, docs, str(tmp_path))
    assert "1 docs" not in notes[1] and "0 docs" not in notes[1]  # rows only on rank 0
    rank0 = notes[0]
    one_doc = extract(llama(0), docs[:1], CONFIG, decode=decode, pad_token_id=PAD, progress=False)
    assert_close(rank0["1 docs"], one_doc, "one document on two data ranks")
    # Prompts fed through the KV cache one column per forward on a tensor-parallel model: the one-process results.
    assert_close(rank0["chunked prefill"], expected["extract"], "x=2 with chunked prefill")
    rows, summary = rank0["0 docs"]
    assert rows == [] and summary["n_docs"] == 0 and summary["exact_match"] is None
    for message in (rank0["error"], notes[1]["error"]):
        assert "evaluation failed on rank(s) [1]" in message and "KeyError: 'document 2 is broken'" in message
    assert rank0["rows fed"] == [2]  # 3 rows over x=2: ceil(3/2) rows per rank
    serial_logits = llama(0)(input_ids=torch.tensor([docs[i].token_ids[:9] for i in (0, 1, 3)])).logits
    for rank in (0, 1):  # the full batch's logits on every rank of the group
        torch.testing.assert_close(
            torch.tensor(notes[rank]["logits"], dtype=torch.float64), serial_logits, rtol=1e-5, atol=1e-6
        )
    assert "fixed length" in rank0["generate"] and "eos_token_id=[]" in rank0["generate"]
    assert rank0["plain model used as is"]
    assert all(notes[r]["loaded in eval mode"] and notes[r]["rank 0 first"] for r in (0, 1))
    assert notes[1]["rank 0 first"] == "0"  # rank 1 read what rank 0 wrote before it
    assert notes[0]["rank 0 found none"] is None and notes[1]["rank 0 found none"] is None  # rank 1 never loaded
    for rank in (0, 1):
        assert "loading the model failed on rank 0: IndexError" in notes[rank]["rank 0 failed"]
    assert "needs a model parallelized on this grid" in rank0["plain model wrapped"]


def _world_4(expected: dict[str, Any], docs: list[Doc]) -> int:
    for shape in ((2, 2, 1, 1), (1, 2, 2, 1)):
        got = parallel_results(shape, docs)
        if got is not None:
            check_against_serial(got, expected, shape)
    return 1


def test_world_4_grids_equal_one_process() -> None:
    docs = documents()
    assert run_distributed(4, _world_4, serial_results(docs), docs) == [1] * 4
