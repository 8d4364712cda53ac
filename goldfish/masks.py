"""Goldfish drop masks: which next-token targets are excluded from the loss.

All functions take *targets*: the already-shifted next-token ids, so position ``j`` holds the token the
model predicts at position ``j`` (see :func:`causal_targets`). A mask is a bool tensor of the targets'
shape, True where the target is DROPPED from the loss. A target equal to ``ignore_index`` or to one of
``special_token_ids`` is never reported as dropped.

Strategies (``STRATEGIES``):

- ``static``: every k-th target position of each row, starting at position 0 (drops 0, k, 2k, ...),
  as the goldfish reference does.
- ``hashed`` (recommended): an order-sensitive integer hash of the h targets ending at ``j`` decides.
  The same h tokens give the same decision wherever they occur, on any device.
- ``hashed-reference``: bit-compatible with the goldfish paper's ``hash-table`` masks as computed on CPU,
  for replicating published checkpoints. It is ORDER-INSENSITIVE (a product of ids) and every window
  holding id 0 shares one decision; prefer ``hashed`` for new work.
- ``apertus``: the mask Apertus (Swiss AI, 2025) was pretrained with, bit-exact with the
  ``swiss-ai/Megatron-LM`` port: ``hashed-reference``'s product hash and CPU table, except that a target
  equal to ``ignore_index`` (padding) enters the windows as id 0, as the port rewrites padding labels
  to 0 before hashing. The app's default for it is k=50, h=50.
- ``megatron-2026``: bit-exact with the ``swiss-ai/Megatron-LM-MoE`` port: each window of h targets is
  hashed as its dot product with h fixed-seed odd int64 coefficients (wrapping modulo 2**64, computed
  exactly on 16-bit limbs), floor-reduced modulo 1,000,003 into the same CPU table. Order-sensitive,
  and id 0 and id 1 count like any id. Padding enters the windows as id 0, as in the port; the port
  exempts the tokenizer's special tokens, which callers pass as ``special_token_ids``. App default
  k=50, h=50.
- ``random``: independent Bernoulli(1/k) per position. The baseline that fails on repeated text: the
  same passage seen twice gets different masks. Deterministic for a given ``seed``; a training loop
  must therefore vary the seed per step (e.g. ``seed = base_seed + step``).

Every hashed strategy (``hashed``, ``hashed-reference``, ``apertus``, ``megatron-2026``) keeps the first
h-1 positions of each row. docs/masks.md says which public implementation each strategy equals.

Only torch (and the torch-free goldfish.strategies) is imported here: this module sits below every other project
package.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import torch

from conventions import IGNORE_INDEX
from goldfish.strategies import STRATEGIES, Strategy  # defined torch-free for the command line; re-exported here

# --- hashed: constants of the order-sensitive window hash -------------------------------------------
# Everything lives in [0, 2**31) and every product is of two values below 2**31, so intermediates stay
# below 2**62 + 2**31 < 2**63: no int64 overflow, identical results on CPU and GPU.
_MASK31 = (1 << 31) - 1
_PRIME31 = (1 << 31) - 1  # Mersenne prime 2**31 - 1: modulus of the polynomial window hash
_POLY_BASE = 1540483477  # base of the polynomial hash, in [2, _PRIME31)
_POLY_START = 1013904242  # non-zero start state, so an all-zero window does not hash to 0
_MIX_MUL1 = 0x2C1B3C6D  # odd multipliers below 2**30 for the 31-bit mixer
_MIX_MUL2 = 0x297A2D39

# --- hashed-reference: constants of the goldfish paper's hash-table masks -----------------------------
REFERENCE_TABLE_SIZE = 1_000_003
REFERENCE_TABLE_SEED = 2971215073
_LIMB_BITS = 16
_LIMB_MASK = (1 << _LIMB_BITS) - 1
_N_LIMBS = 4  # 4 x 16 bits = one 64-bit word

# --- megatron-2026: the coefficient hash of the Megatron-LM-MoE port ----------------------------------
# h coefficients drawn by torch.randint(0, 2**62) on a CPU generator seeded REFERENCE_TABLE_SEED + h, each
# made odd by setting bit 0.
_COEFFICIENT_HIGH = 1 << 62


def drop_mask(
    targets: torch.Tensor,
    strategy: Strategy,
    k: int,
    h: int = 13,
    *,
    ignore_index: int = IGNORE_INDEX,
    special_token_ids: Iterable[int] = (),
    seed: int = 0,
) -> torch.Tensor:
    """Return which targets to drop from the loss.

    Args:
        targets: (B, T) or (T,) integer tensor of next-token ids (position j = token predicted at j),
            ``ignore_index`` where there is no target (padding, prompt).
        strategy: one of ``STRATEGIES``.
        k: drop rate is 1/k (``static``: exactly one position in k).
        h: window length of the hashed strategies (the target and its h-1 predecessors). The first
            h-1 positions of each row have no full window and are never dropped.
        ignore_index: target value meaning "no target"; never dropped. In ``hashed``, a window that
            contains it is incomplete, so its position is kept (like the first h-1 of a row): the
            decision depends on h real consecutive targets only. ``hashed-reference`` multiplies the raw
            values as the reference does; ``apertus`` and ``megatron-2026`` read it as id 0, as the
            Megatron-LM ports do with padding labels.
        special_token_ids: ids (BOS/EOS/PAD...) whose own position is never dropped. They still take part
            in the windows of the positions after them.
        seed: seed of the ``random`` strategy (ignored by the others).

    Returns:
        bool tensor of ``targets``' shape and device, True where the target is dropped.
    """
    _validate(targets, strategy, k, h)
    squeeze = targets.dim() == 1
    rows = targets.reshape(1, -1) if squeeze else targets
    rows = rows.to(torch.int64)

    if strategy == "static":
        dropped = _static_mask(rows, k)
    elif strategy == "hashed":
        dropped = _hashed_mask(rows, k, h, ignore_index)
    elif strategy == "hashed-reference":
        dropped = _reference_mask(rows, k, h)
    elif strategy == "apertus":
        dropped = _reference_mask(_padding_as_zero(rows, ignore_index), k, h)
    elif strategy == "megatron-2026":
        dropped = _coefficient_mask(_padding_as_zero(rows, ignore_index), k, h)
    else:  # "random"; _validate rejected anything else
        dropped = _random_mask(rows, k, seed)

    exempt = rows == ignore_index
    special = [int(t) for t in special_token_ids]
    if special:
        exempt |= torch.isin(rows, torch.tensor(special, dtype=torch.int64, device=rows.device))
    dropped = dropped & ~exempt
    return dropped.reshape(targets.shape)


def _validate(targets: torch.Tensor, strategy: Strategy, k: int, h: int) -> None:
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown goldfish strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 2:
        raise ValueError(f"k must be an integer >= 2 (drop rate 1/k), got {k!r}")
    if isinstance(h, bool) or not isinstance(h, int) or h < 1:
        raise ValueError(f"h must be an integer >= 1 (hash window length), got {h!r}")
    if not isinstance(targets, torch.Tensor):
        raise TypeError(f"targets must be a torch.Tensor of token ids, got {type(targets).__name__}")
    if targets.dtype == torch.bool or targets.is_floating_point() or targets.is_complex():
        raise ValueError(f"targets must hold integer token ids, got dtype {targets.dtype}; pass a torch.long tensor")
    if targets.dim() not in (1, 2):
        raise ValueError(f"targets must be (T,) or (B, T), got shape {tuple(targets.shape)}")


def _static_mask(rows: torch.Tensor, k: int) -> torch.Tensor:
    """(B, T) -> (B, T): positions 0, k, 2k, ... of every row."""
    positions = torch.arange(rows.shape[1], device=rows.device)
    return (positions % k == 0).expand(rows.shape).clone()


def _random_mask(rows: torch.Tensor, k: int, seed: int) -> torch.Tensor:
    """(B, T) -> (B, T): Bernoulli(1/k) per position, drawn on CPU so every device gets the same mask."""
    generator = torch.Generator(device="cpu")
    generator.manual_seed(seed)
    uniform = torch.rand(rows.shape, generator=generator)
    return (uniform < 1.0 / k).to(rows.device)


def _mix31(x: torch.Tensor) -> torch.Tensor:
    """A bijection of [0, 2**31) with good avalanche (xor-shift / odd-multiply rounds, mod 2**31).

    Each input bit flips each output bit with probability 0.5 +- 0.004 (measured on 2e5 random inputs).
    Products stay below 2**31 * 2**30 = 2**61.
    """
    x = x ^ (x >> 16)
    x = (x * _MIX_MUL1) & _MASK31
    x = x ^ (x >> 15)
    x = (x * _MIX_MUL2) & _MASK31
    return x ^ (x >> 16)


def _hashed_mask(rows: torch.Tensor, k: int, h: int, ignore_index: int) -> torch.Tensor:
    """(B, T) -> (B, T): order-sensitive window hash below 1/k of its range.

    hash(window) = mix31(polynomial over the window of mix31(token mod (2**31 - 1)), mod 2**31 - 1).
    Mixing each token first makes small ids (0, 1) ordinary; the polynomial makes the hash depend on the
    order of the tokens; the final mix spreads nearby polynomial values over the whole range.
    Token ids that differ by a multiple of 2**31 - 1 hash alike (no real vocabulary is that large).
    """
    n_rows, length = rows.shape
    dropped = torch.zeros_like(rows, dtype=torch.bool)
    n_windows = length - h + 1
    if n_windows <= 0:
        return dropped

    codes = _mix31(torch.remainder(rows, _PRIME31))  # (B, T) in [0, 2**31)
    state = torch.full((n_rows, n_windows), _POLY_START, dtype=torch.int64, device=rows.device)
    for offset in range(h):  # window ending at j = offset-th .. last token of the window
        state.mul_(_POLY_BASE).add_(codes[:, offset : offset + n_windows]).remainder_(_PRIME31)
    hashed = _mix31(state)  # (B, T-h+1) in [0, 2**31)
    threshold = -(-(1 << 31) // k)  # ceil(2**31 / k): drop iff hashed / 2**31 < 1 / k
    window_drop = hashed < threshold

    # A window holding ignore_index lacks h real targets: keep its position.
    ignored = torch.cumsum((rows == ignore_index).to(torch.int64), dim=1)  # (B, T)
    ignored = torch.nn.functional.pad(ignored, (1, 0))  # ignored[:, j] = count in rows[:, :j]
    ignored_in_window = ignored[:, h:] - ignored[:, :n_windows]
    dropped[:, h - 1 :] = window_drop & (ignored_in_window == 0)
    return dropped


@functools.lru_cache(maxsize=4)
def _reference_table(device: torch.device) -> torch.Tensor:
    """The reference's table of 1,000,003 uniform float32 values, always drawn on CPU, then moved."""
    generator = torch.Generator(device="cpu")
    generator.manual_seed(REFERENCE_TABLE_SEED)
    table = torch.rand(REFERENCE_TABLE_SIZE, generator=generator)
    return table.to(device)


def _to_limbs(x: torch.Tensor) -> list[torch.Tensor]:
    """int64 -> four 16-bit limbs (least significant first) of its two's-complement 64-bit word."""
    return [(x >> (_LIMB_BITS * i)) & _LIMB_MASK for i in range(_N_LIMBS)]


def _mul_limbs_mod_2_64(a: list[torch.Tensor], b: list[torch.Tensor] | list[int]) -> list[torch.Tensor]:
    """(a * b) mod 2**64 on 16-bit limbs; each partial sum stays below 2**35, far from overflow."""
    out = []
    carry = torch.zeros_like(a[0])
    for n in range(_N_LIMBS):
        column = carry
        for i in range(n + 1):
            column = column + a[i] * b[n - i]
        out.append(column & _LIMB_MASK)
        carry = column >> _LIMB_BITS
    return out


def _signed_limbs_mod_table(limbs: list[torch.Tensor]) -> torch.Tensor:
    """Four 16-bit limbs of a 64-bit word -> the word read as a signed int64, floor-modulo 1,000,003.

    Unsigned value U = sum limb_i * 2**(16 i); the signed int64 is U - 2**64 when the top bit is set.
    """
    key = torch.zeros_like(limbs[0])
    for i, limb in enumerate(limbs):
        key = key + limb * pow(2, _LIMB_BITS * i, REFERENCE_TABLE_SIZE)  # < 2**16 * 2**20 each
    negative = (limbs[-1] >> (_LIMB_BITS - 1)) & 1
    key = key - negative * pow(2, 64, REFERENCE_TABLE_SIZE)
    return torch.remainder(key, REFERENCE_TABLE_SIZE)  # floor modulo: in [0, 1,000,003)


def reference_window_keys(rows: torch.Tensor, h: int) -> torch.Tensor:
    """(B, T) int64 -> (B, T-h+1): the reference's table key of each window of h targets.

    The reference multiplies the h ids of the window in int64, where the product wraps around in two's
    complement, and reduces the wrapped (signed) product with a floor modulo by 1,000,003. We compute the
    same number exactly with 16-bit limbs instead of relying on int64 wraparound, which C++ leaves
    undefined; the result does not depend on the device.
    """
    n_windows = rows.shape[1] - h + 1
    product = _to_limbs(rows[:, :n_windows])
    for offset in range(1, h):
        product = _mul_limbs_mod_2_64(product, _to_limbs(rows[:, offset : offset + n_windows]))
    return _signed_limbs_mod_table(product)


def _reference_mask(rows: torch.Tensor, k: int, h: int) -> torch.Tensor:
    """(B, T) -> (B, T): the goldfish paper's hash-table rule (order-insensitive window product).

    Drop position j >= h-1 iff table[key(window ending at j)] < 1/k, the float32 table value compared
    with 1/k as torch compares a float32 tensor with a Python float. Positions 0..h-2 are never dropped
    (the reference takes windows with ``unfold(1, h, 1)`` and writes their decisions from position h-1).
    """
    dropped = torch.zeros_like(rows, dtype=torch.bool)
    if rows.shape[1] - h + 1 <= 0:
        return dropped
    table = _reference_table(rows.device)
    dropped[:, h - 1 :] = table[reference_window_keys(rows, h)] < 1 / k
    return dropped


def _padding_as_zero(rows: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """The Megatron-LM ports' reading of padding: a padding label is rewritten to id 0 before hashing."""
    return torch.where(rows == ignore_index, torch.zeros_like(rows), rows)


@functools.lru_cache(maxsize=16)
def megatron_2026_coefficients(h: int) -> tuple[int, ...]:
    """The h odd int64 coefficients of the megatron-2026 window hash (oldest target's first).

    Drawn as the Megatron-LM-MoE port draws them when its labels live on CPU (they do: its dataset builds
    them from numpy): ``torch.randint(0, 2**62, (h,))`` on a CPU generator seeded 2971215073 + h, then
    bit 0 set. Always drawn on CPU here, whatever the targets' device.
    """
    generator = torch.Generator(device="cpu")
    generator.manual_seed(REFERENCE_TABLE_SEED + h)
    drawn = torch.randint(0, _COEFFICIENT_HIGH, (h,), dtype=torch.int64, generator=generator)
    return tuple(int(c) | 1 for c in drawn.tolist())


def coefficient_window_keys(rows: torch.Tensor, h: int) -> torch.Tensor:
    """(B, T) int64 -> (B, T-h+1): the megatron-2026 table key of each window of h targets.

    key = (sum over the window of target_i * coefficient_i) as a wrapped signed int64, floor-modulo
    1,000,003. Each product is taken modulo 2**64 on 16-bit limbs, the limbs of the h products are summed
    column by column (below h * 2**16 each) and the carries propagated once, so the 64-bit word is exact
    on any device without relying on int64 overflow.
    """
    n_windows = rows.shape[1] - h + 1
    total = [torch.zeros_like(rows[:, :n_windows]) for _ in range(_N_LIMBS)]
    for offset, coefficient in enumerate(megatron_2026_coefficients(h)):
        constant = [(coefficient >> (_LIMB_BITS * i)) & _LIMB_MASK for i in range(_N_LIMBS)]
        product = _mul_limbs_mod_2_64(_to_limbs(rows[:, offset : offset + n_windows]), constant)
        total = [t + p for t, p in zip(total, product)]
    carry = torch.zeros_like(total[0])
    word = []
    for column in total:
        column = column + carry
        word.append(column & _LIMB_MASK)
        carry = column >> _LIMB_BITS  # the carry out of the top limb is the 2**64 wrap: dropped
    return _signed_limbs_mod_table(word)


def _coefficient_mask(rows: torch.Tensor, k: int, h: int) -> torch.Tensor:
    """(B, T) -> (B, T): the Megatron-LM-MoE port's rule: table[coefficient key of the window] < 1/k.

    Same table and threshold as ``hashed-reference``; positions 0..h-2 are never dropped.
    """
    dropped = torch.zeros_like(rows, dtype=torch.bool)
    if rows.shape[1] - h + 1 <= 0:
        return dropped
    table = _reference_table(rows.device)
    dropped[:, h - 1 :] = table[coefficient_window_keys(rows, h)] < 1 / k
    return dropped


def causal_targets(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    ignore_index: int = IGNORE_INDEX,
) -> torch.Tensor:
    """Shift (B, T) input ids to (B, T) next-token targets.

    ``targets[:, j] = input_ids[:, j + 1]``; the last column and every position whose target is padding
    (``attention_mask[:, j + 1] == 0``) hold ``ignore_index``. So ``logits[:, j]`` of a causal LM fed
    ``input_ids`` predicts ``targets[:, j]``.
    """
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (B, T), got shape {tuple(input_ids.shape)}")
    if attention_mask is not None and attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask shape {tuple(attention_mask.shape)} must equal input_ids shape {tuple(input_ids.shape)}"
        )
    targets = torch.full_like(input_ids, ignore_index)
    targets[:, :-1] = input_ids[:, 1:]
    if attention_mask is not None:
        padded = torch.zeros_like(input_ids, dtype=torch.bool)
        padded[:, :-1] = attention_mask[:, 1:] == 0
        targets[padded] = ignore_index
    return targets


_ANSI_DROPPED = "\x1b[7;31m"  # reverse video, red
_ANSI_RESET = "\x1b[0m"


def format_masked_text(token_strings: list[str], dropped: list[bool], color: bool = True) -> str:
    """Join token strings, highlighting dropped ones (ANSI reverse red, or ``[[token]]`` without color)."""
    if len(token_strings) != len(dropped):
        raise ValueError(
            f"got {len(token_strings)} token strings but {len(dropped)} drop flags; pass one flag per token"
        )
    pieces = []
    for text, is_dropped in zip(token_strings, dropped):
        if not is_dropped:
            pieces.append(text)
        elif color:
            pieces.append(f"{_ANSI_DROPPED}{text}{_ANSI_RESET}")
        else:
            pieces.append(f"[[{text}]]")
    return "".join(pieces)
