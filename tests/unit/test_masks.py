"""Properties of goldfish.masks.drop_mask and its helpers.

Statistical checks use binomial bounds: with n independent decisions of probability p, the observed
rate lies within 5 standard deviations, 5 * sqrt(p (1 - p) / n), of p except with probability < 1e-6.
The hashes are deterministic, so a test that passes once passes every time; the bound explains why a
correct hash passes and a biased one (e.g. rate 0 or 1 on windows holding id 0) fails.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from goldfish.masks import (
    IGNORE_INDEX,
    REFERENCE_TABLE_SEED,
    REFERENCE_TABLE_SIZE,
    STRATEGIES,
    causal_targets,
    drop_mask,
    format_masked_text,
)

VOCAB = 50_000
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def random_ids(shape: tuple[int, ...], seed: int, low: int = 0, high: int = VOCAB) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, shape, generator=generator)


def five_sigma(p: float, n: int) -> float:
    return 5 * math.sqrt(p * (1 - p) / n)


def window_decisions(windows: torch.Tensor, strategy: str, k: int) -> torch.Tensor:
    """(N, h) windows -> (N,) bool: the decision at the end of each window, each window its own row."""
    h = windows.shape[1]
    return drop_mask(windows, strategy, k, h)[:, h - 1]


# --- shapes, devices, dtypes --------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_shape_device_dtype(strategy: str, device: str) -> None:
    targets = random_ids((3, 40), seed=0).to(device)
    mask = drop_mask(targets, strategy, k=4, h=5)
    assert mask.dtype == torch.bool and mask.shape == targets.shape and mask.device == targets.device
    flat = drop_mask(targets[1], strategy, k=4, h=5)
    assert flat.shape == (40,) and flat.dtype == torch.bool
    # A single row gives the same mask as 1-D input (the random strategy draws per shape, so skip it).
    if strategy != "random":
        assert torch.equal(flat, drop_mask(targets[1:2], strategy, k=4, h=5)[0])
    # int32 ids give the same mask as int64 ids.
    assert torch.equal(mask, drop_mask(targets.to(torch.int32), strategy, k=4, h=5))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_rows_shorter_than_window_and_empty(strategy: str) -> None:
    short = random_ids((2, 3), seed=1)
    mask = drop_mask(short, strategy, k=2, h=13)
    if strategy.startswith("hashed"):
        assert not mask.any()  # no complete window
    assert drop_mask(torch.zeros(2, 0, dtype=torch.long), strategy, k=2).shape == (2, 0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_cpu_and_cuda_masks_are_identical(strategy: str) -> None:
    targets = random_ids((8, 512), seed=2)
    assert torch.equal(drop_mask(targets, strategy, 4), drop_mask(targets.cuda(), strategy, 4).cpu())


# --- static -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [2, 3, 4, 7])
def test_static_drops_positions_0_k_2k(k: int) -> None:
    targets = random_ids((3, 50), seed=3)
    mask = drop_mask(targets, "static", k)
    expected = torch.tensor([j % k == 0 for j in range(50)]).expand(3, 50)
    assert torch.equal(mask, expected)


# --- hashed -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["hashed", "hashed-reference"])
@pytest.mark.parametrize("h", [1, 4, 13])
def test_hashed_first_h_minus_1_never_dropped(strategy: str, h: int) -> None:
    targets = random_ids((256, 40), seed=4)
    mask = drop_mask(targets, strategy, k=2, h=h)
    assert not mask[:, : h - 1].any()
    # With k=2 and 256 rows, every later column has drops: the rule is about position, not luck.
    assert mask[:, h - 1 :].any(dim=0).all()


@pytest.mark.parametrize("strategy", ["hashed", "hashed-reference"])
def test_same_window_same_decision_anywhere(strategy: str) -> None:
    h, k, n = 13, 2, 400
    windows = random_ids((n, h), seed=5)
    # Document A: each window at position 20 of its own row, after random context.
    doc_a = random_ids((n, 60), seed=6)
    doc_a[:, 20 - h + 1 : 21] = windows
    # Document B: the same windows in other rows (rolled), at position 47, after other context.
    doc_b = random_ids((n, 60), seed=7)
    order = torch.roll(torch.arange(n), 17)
    doc_b[:, 47 - h + 1 : 48] = windows[order]
    alone = window_decisions(windows, strategy, k)
    in_a = drop_mask(doc_a, strategy, k, h)[:, 20]
    in_b = drop_mask(doc_b, strategy, k, h)[:, 47]
    assert torch.equal(in_a, alone)
    assert torch.equal(in_b, alone[order])
    # Both decisions occur, so equality is not trivial (p = 1/2: the rate is within 5 sigma of 0.5).
    assert abs(alone.float().mean().item() - 0.5) < five_sigma(0.5, n)


def test_hashed_is_order_sensitive() -> None:
    """Permuting a window gives an independent decision: P(decisions differ) = 2 p (1 - p)."""
    h, k, n = 13, 4, 20_000
    windows = random_ids((n, h), seed=8)
    permutation = torch.argsort(torch.rand((n, h), generator=torch.Generator().manual_seed(9)), dim=1)
    permuted = torch.gather(windows, 1, permutation)
    changed = (permuted != windows).any(dim=1)  # windows whose permutation is not the identity
    differ = window_decisions(windows, "hashed", k) != window_decisions(permuted, "hashed", k)
    p = 1 / k
    expected = 2 * p * (1 - p)
    rate = differ[changed].float().mean().item()
    assert abs(rate - expected) < five_sigma(expected, int(changed.sum()))


def test_hashed_reference_is_order_insensitive() -> None:
    """Documented weakness of the reference rule: a product does not see order."""
    windows = random_ids((2_000, 13), seed=8)
    reversed_windows = windows.flip(1)
    assert torch.equal(
        window_decisions(windows, "hashed-reference", 4), window_decisions(reversed_windows, "hashed-reference", 4)
    )


@pytest.mark.parametrize("special_id", [0, 1])
def test_hashed_windows_with_0_or_1_are_ordinary(special_id: int) -> None:
    h, k, n = 13, 4, 20_000
    p = 1 / k
    windows = random_ids((n, h), seed=10, low=2)
    holes = torch.rand((n, h), generator=torch.Generator().manual_seed(11)) < 0.5
    holes[:, 0] = True  # every window holds the id at least once
    windows[holes] = special_id
    rate = window_decisions(windows, "hashed", k).float().mean().item()
    assert abs(rate - p) < five_sigma(p, n)

    # All 2**13 distinct windows made only of ids 0 and 1.
    bits = torch.arange(2**h).unsqueeze(1) >> torch.arange(h) & 1  # (8192, 13)
    rate01 = window_decisions(bits, "hashed", k).float().mean().item()
    assert abs(rate01 - p) < five_sigma(p, 2**h)


def test_hashed_reference_collapses_windows_with_0() -> None:
    """The reference defect our hashed strategy fixes: every window holding 0 has key 0, one decision."""
    windows = random_ids((1_000, 13), seed=12)
    windows[:, 5] = 0
    decisions = window_decisions(windows, "hashed-reference", 4)
    assert decisions.all() or not decisions.any()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_ignore_and_special_never_dropped(strategy: str) -> None:
    targets = random_ids((64, 100), seed=13, high=20)
    targets[targets == 3] = IGNORE_INDEX
    special = (5, 7)
    mask = drop_mask(targets, strategy, k=2, h=3, special_token_ids=special)
    protected = (targets == IGNORE_INDEX) | (targets == 5) | (targets == 7)
    assert protected.any() and not (mask & protected).any()
    assert mask.any()  # the other positions do get dropped


def test_hashed_window_with_ignore_is_kept_and_special_ids_stay_in_windows() -> None:
    h = 4
    targets = random_ids((512, 30), seed=14)
    targets[:, 10] = IGNORE_INDEX
    mask = drop_mask(targets, "hashed", k=2, h=h)
    # Windows ending at 10..13 contain position 10: kept, like the first h-1 positions of a row.
    assert not mask[:, 10 : 10 + h].any()
    assert mask[:, 10 + h].any()
    # A special id exempts its own position only; windows through it are hashed as usual.
    targets = random_ids((512, 30), seed=15)
    targets[:, 10] = 42
    mask = drop_mask(targets, "hashed", k=2, h=h, special_token_ids=[42])
    assert not mask[:, 10].any()
    assert abs(mask[:, 11:14].float().mean().item() - 0.5) < five_sigma(0.5, 512 * 3)


@pytest.mark.parametrize("strategy", ["hashed", "hashed-reference", "random"])
@pytest.mark.parametrize("k", [2, 3, 4, 8])
def test_drop_rate_is_1_over_k_on_random_ids(strategy: str, k: int) -> None:
    h = 13
    targets = random_ids((16, 4096), seed=16 + k)
    mask = drop_mask(targets, strategy, k, h, seed=k)
    eligible = mask[:, h - 1 :] if strategy != "random" else mask
    p = 1 / k
    assert abs(eligible.float().mean().item() - p) < five_sigma(p, eligible.numel())


def word_ids_of_real_text() -> torch.Tensor:
    """(N,) word-level ids of the standard library's documentation topics (real English, Zipfian)."""
    import pydoc_data.topics

    words = re.findall(r"\w+|[^\w\s]", " ".join(pydoc_data.topics.topics.values()))
    vocabulary: dict[str, int] = {}
    return torch.tensor([vocabulary.setdefault(word, len(vocabulary)) for word in words])


@pytest.mark.parametrize("k", [2, 3, 4, 8])
def test_hashed_drop_rate_on_real_text(k: int) -> None:
    h = 13
    ids = word_ids_of_real_text()
    mask = drop_mask(ids, "hashed", k, h)[h - 1 :]
    windows = ids.unfold(0, h, 1)  # (N - h + 1, h), window ending at each position >= h-1
    # Repeated windows share one decision, so count each distinct window once.
    unique, first = _first_occurrences(windows)
    p = 1 / k
    rate_unique = mask[first].float().mean().item()
    assert unique > 50_000
    assert abs(rate_unique - p) < five_sigma(p, unique)


def _first_occurrences(windows: torch.Tensor) -> tuple[int, torch.Tensor]:
    _, inverse = torch.unique(windows, dim=0, return_inverse=True)
    n_unique = int(inverse.max()) + 1
    first = torch.full((n_unique,), windows.shape[0], dtype=torch.long)
    first.scatter_reduce_(0, inverse, torch.arange(windows.shape[0]), reduce="amin")
    return n_unique, first


# --- hashed-reference: bit compatibility ----------------------------------------------------------------


def reference_table_values() -> list[float]:
    generator = torch.Generator(device="cpu").manual_seed(REFERENCE_TABLE_SEED)
    return torch.rand(REFERENCE_TABLE_SIZE, generator=generator).tolist()


def test_reference_table_is_the_published_one() -> None:
    """Tripwire: torch's CPU generator still draws the table the published runs used (values from torch 2.13)."""
    table = reference_table_values()
    assert table[:4] == [0.23368388414382935, 0.4412640333175659, 0.7411476969718933, 0.9092718958854675]


def slow_reference_mask(targets: torch.Tensor, k: int, h: int, table: list[float]) -> torch.Tensor:
    """The reference rule, one position at a time, with exact Python integers.

    key = (product of the h window ids, wrapped to a signed 64-bit integer) floor-mod 1,000,003;
    drop iff table[key] < 1/k; positions before h-1 kept. The float32 table value is compared with the
    double 1/k; torch compares with float32(1/k), which decides the same for the k tested here (2, 3,
    4, 8) because no multiple of 2**-24, the grid of torch.rand's float32 values, lies between the two.
    """
    mask = torch.zeros_like(targets, dtype=torch.bool)
    for b in range(targets.shape[0]):
        row = targets[b].tolist()
        for j in range(h - 1, len(row)):
            product = 1
            for token in row[j - h + 1 : j + 1]:
                product *= token
            wrapped = (product + 2**63) % 2**64 - 2**63
            mask[b, j] = table[wrapped % REFERENCE_TABLE_SIZE] < 1 / k
    return mask


@pytest.mark.parametrize("k", [2, 3, 4, 8])
@pytest.mark.parametrize(("h", "high"), [(1, VOCAB), (4, 300), (13, 40), (13, VOCAB), (13, 2**31)])
def test_hashed_reference_matches_slow_reference(k: int, h: int, high: int) -> None:
    """Small ids (4 x 300, 13 x 40: products below 2**63) and large ones (products that overflow int64)."""
    table = reference_table_values()
    targets = random_ids((3, 120), seed=17 + h + k, high=high)
    targets[0, 50] = IGNORE_INDEX  # the reference multiplies whatever value is there; its own position is kept
    targets[1, 60] = 0
    expected = slow_reference_mask(targets, k, h, table)
    expected[0, 50] = False
    assert torch.equal(drop_mask(targets, "hashed-reference", k, h), expected)


def test_hashed_reference_matches_the_literal_reference_expression() -> None:
    """Equal to the reference's own torch expression on CPU (int64 prod that wraps, floor mod, table lookup)."""
    table = torch.tensor(reference_table_values())
    h, k = 13, 4
    targets = random_ids((8, 300), seed=18)
    literal = torch.zeros_like(targets, dtype=torch.bool)
    literal[:, h - 1 :] = table[targets.unfold(1, h, 1).prod(dim=-1) % REFERENCE_TABLE_SIZE] < 1 / k
    assert torch.equal(drop_mask(targets, "hashed-reference", k, h), literal)


# --- random -------------------------------------------------------------------------------------------


def test_random_is_deterministic_by_seed_and_seeds_differ() -> None:
    targets = random_ids((8, 512), seed=19)
    a = drop_mask(targets, "random", 4, seed=123)
    assert torch.equal(a, drop_mask(targets, "random", 4, seed=123))
    b = drop_mask(targets, "random", 4, seed=124)
    # Independent masks differ at 2 p (1 - p) = 37.5% of positions; require at least 30%.
    assert (a != b).float().mean().item() > 0.30
    # Positions are dropped independently of the token: the same ids at another time get another mask.
    repeated = targets[0].repeat(8, 1)
    assert not torch.equal(drop_mask(repeated, "random", 4, seed=1)[0], drop_mask(repeated, "random", 4, seed=1)[1])


# --- validation ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 0, -3, 2.5, True, "4"])
def test_bad_k_is_rejected(k: object) -> None:
    with pytest.raises(ValueError, match="k must be an integer >= 2"):
        drop_mask(random_ids((2, 20), seed=0), "hashed", k)  # type: ignore[arg-type]


@pytest.mark.parametrize("h", [0, -1, 1.5, False])
def test_bad_h_is_rejected(h: object) -> None:
    with pytest.raises(ValueError, match="h must be an integer >= 1"):
        drop_mask(random_ids((2, 20), seed=0), "hashed", 4, h)  # type: ignore[arg-type]


def test_unknown_strategy_lists_valid_ones() -> None:
    with pytest.raises(ValueError, match="static, hashed, hashed-reference, random, apertus, megatron-2026"):
        drop_mask(random_ids((2, 20), seed=0), "hash-table", 4)


@pytest.mark.parametrize(
    "targets",
    [torch.zeros(2, 5), torch.zeros(2, 5, dtype=torch.bool), torch.zeros(2, 3, 4, dtype=torch.long), torch.tensor(3)],
)
def test_bad_targets_are_rejected(targets: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="targets must"):
        drop_mask(targets, "static", 4)


# --- causal_targets and format_masked_text --------------------------------------------------------------


def test_causal_targets_shift_and_padding() -> None:
    input_ids = torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]])
    attention_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    assert causal_targets(input_ids).tolist() == [[6, 7, 8, -100], [10, 0, 0, -100]]
    assert causal_targets(input_ids, attention_mask).tolist() == [[6, 7, 8, -100], [10, -100, -100, -100]]
    with pytest.raises(ValueError, match="must equal input_ids shape"):
        causal_targets(input_ids, attention_mask[:, :3])


def test_format_masked_text() -> None:
    tokens = ["The", " cat", " sat"]
    assert format_masked_text(tokens, [False, True, False], color=False) == "The[[ cat]] sat"
    colored = format_masked_text(tokens, [True, False, False])
    assert colored.startswith("\x1b[7;31mThe\x1b[0m") and colored.endswith(" cat sat")
    with pytest.raises(ValueError, match="one flag per token"):
        format_masked_text(tokens, [True])
