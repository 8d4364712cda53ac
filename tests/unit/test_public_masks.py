"""Our named masks against the public goldfish implementations, position by position.

The fixtures in tests/fixtures/public_masks/ were produced by running each upstream function on CPU outside this
repository (tests/fixtures/public_masks/README.md gives the commands and the upstream commits):

- paper_hash_table.json: ahans30/goldfish-loss, lit_gpt/utils.py, apply_goldfish(strategy="hash-table")
  -> our "hashed-reference" (same ignore_index, raw values multiplied);
- apertus_megatron.json: swiss-ai/Megatron-LM, megatron/core/datasets/gpt_dataset.py, apply_goldfish as
  GPTDataset.__getitem__ calls it (padding labels rewritten to id 0) -> our "apertus";
- megatron_moe_2026.json: swiss-ai/Megatron-LM-MoE, megatron/core/datasets/goldfish.py, apply_goldfish with the
  fixture's special-token exemption set -> our "megatron-2026".

Each fixture row stores its targets (padding written as the case's ignore_index) and the positions the upstream
function dropped. The ports also mark padding positions, which their loss mask zeroes anyway; drop_mask never
reports ignore_index as dropped, so the comparison is on every position, with padding expected kept.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from goldfish.masks import drop_mask, megatron_2026_coefficients

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "public_masks"

CASES = {
    "paper_hash_table.json": "hashed-reference",
    "apertus_megatron.json": "apertus",
    "megatron_moe_2026.json": "megatron-2026",
}


def load(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def compare(fixture: dict, strategy: str) -> tuple[int, int]:
    """Assert our mask equals the fixture's at every position; return (positions compared, drops expected)."""
    compared = dropped = 0
    for n, case in enumerate(fixture["cases"]):
        for r, (row, upstream) in enumerate(zip(case["rows"], case["dropped"])):
            targets = torch.tensor(row, dtype=torch.long)
            expected = torch.zeros(len(row), dtype=torch.bool)
            expected[upstream] = True
            expected &= targets != case["ignore_index"]
            ours = drop_mask(
                targets,
                strategy,
                case["k"],
                case["h"],
                ignore_index=case["ignore_index"],
                special_token_ids=case.get("special_token_ids", ()),
            )
            differ = torch.nonzero(ours != expected).flatten().tolist()
            assert not differ, (
                f"{strategy}: case {n} (k={case['k']}, h={case['h']}) row {r}: {len(differ)} positions differ, "
                f"first {differ[:5]}"
            )
            compared += len(row)
            dropped += int(expected.sum())
    return compared, dropped


@pytest.mark.parametrize("name", sorted(CASES))
def test_mask_equals_public_implementation(name: str) -> None:
    fixture = load(name)
    compared, dropped = compare(fixture, CASES[name])
    assert compared == fixture["positions"]
    # The comparison is not vacuous: the upstream function dropped positions in every fixture.
    assert dropped > 0


def test_paper_fixture_as_batches() -> None:
    """The paper's function takes (B, T) batches: our mask of the whole batch equals it too."""
    fixture = load("paper_hash_table.json")
    for case in fixture["cases"]:
        targets = torch.tensor(case["rows"], dtype=torch.long)
        expected = torch.zeros_like(targets, dtype=torch.bool)
        for r, upstream in enumerate(case["dropped"]):
            expected[r, upstream] = True
        expected &= targets != case["ignore_index"]
        ours = drop_mask(targets, "hashed-reference", case["k"], case["h"], ignore_index=case["ignore_index"])
        assert torch.equal(ours, expected)


def test_megatron_2026_coefficients_are_the_ports() -> None:
    fixture = load("megatron_moe_2026.json")
    for case in fixture["cases"]:
        assert list(megatron_2026_coefficients(case["h"])) == case["coefficients"]


def test_fixtures_cover_the_defaults_and_small_windows() -> None:
    for name in CASES:
        settings = {(case["k"], case["h"]) for case in load(name)["cases"]}
        assert (50, 50) in settings and (4, 13) in settings and (3, 1) in settings


def test_fixtures_tell_the_strategies_apart() -> None:
    """The fixtures have the power to catch a wrong strategy: padding read as id 0 (Apertus) and the exempt special
    tokens (MoE port) change decisions in them."""
    with pytest.raises(AssertionError, match="positions differ"):
        compare(load("apertus_megatron.json"), "hashed-reference")
    moe = load("megatron_moe_2026.json")
    for case in moe["cases"]:
        case["special_token_ids"] = []
    with pytest.raises(AssertionError, match="positions differ"):
        compare(moe, "megatron-2026")
    with pytest.raises(AssertionError, match="positions differ"):
        compare(load("megatron_moe_2026.json"), "apertus")
