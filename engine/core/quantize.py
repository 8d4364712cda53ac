"""Block quantization for ZeRO++'s quantized collectives (qwZ weights, qgZ gradients; engine/core/comm.py).

A flat float tensor is cut into blocks of `block` elements (the last one zero-padded). Each block keeps one
float32 scale, max|x| / qmax, and its elements as signed integers round(x / scale) in [-qmax, qmax]
(symmetric, round to nearest): qmax = 127 for int8, 7 for int4 (two codes per byte). Dequantizing gives
codes * scale, so every element is off by at most scale / 2 = max|block| / (2 * qmax): 1/254 of the block's
largest magnitude for int8, 1/14 for int4. A block of zeros has scale 0 and comes back exactly.

What travels is one uint8 payload per tensor: the codes (n_padded * bits / 8 bytes) followed by the scales
(4 bytes per block), so a collective moves 1 + 4 / block bytes per element at int8 (0.27 of float32 at the
default block of 256) and 0.5 + 4 / block at int4.
"""

from __future__ import annotations

import torch

from engine.spec import BlockFormat  # bits and block size; torch-free, so the cost model counts the same bytes


def _blocks(x: torch.Tensor, fmt: BlockFormat) -> torch.Tensor:
    """`x` flattened to float32 and zero-padded into (blocks, fmt.block)."""
    flat = x.detach().reshape(-1).float()
    n_blocks = fmt.blocks(flat.numel())
    padded = flat.new_zeros(n_blocks * fmt.block)
    padded[: flat.numel()] = flat
    return padded.view(n_blocks, fmt.block)


def quantize(x: torch.Tensor, fmt: BlockFormat) -> torch.Tensor:
    """The uint8 payload (fmt.payload_bytes(x.numel()) bytes) of the flat float tensor `x`."""
    blocks = _blocks(x, fmt)
    scales = blocks.abs().amax(dim=1) / fmt.qmax
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    codes = torch.round(blocks / safe[:, None]).clamp_(-fmt.qmax, fmt.qmax).to(torch.int8)
    if fmt.bits == 8:
        code_bytes = codes.view(torch.uint8).reshape(-1)
    else:  # two 4-bit codes per byte, offset to 0..14
        nibbles = (codes.reshape(-1, 2).to(torch.int16) + 8).to(torch.uint8)
        code_bytes = nibbles[:, 0] | (nibbles[:, 1] << 4)
    return torch.cat([code_bytes, scales.contiguous().view(torch.uint8)])


def dequantize(payload: torch.Tensor, numel: int, fmt: BlockFormat, dtype: torch.dtype) -> torch.Tensor:
    """The `numel` elements (dtype `dtype`) a payload of `quantize` stands for."""
    n_blocks = fmt.blocks(numel)
    code_len = n_blocks * fmt.block * fmt.bits // 8
    if payload.numel() != code_len + 4 * n_blocks:
        raise ValueError(f"payload of {payload.numel()} bytes does not hold {numel} elements at {fmt}")
    scales = payload[code_len:].clone().view(torch.float32)
    code_bytes = payload[:code_len]
    if fmt.bits == 8:
        codes = code_bytes.view(torch.int8).float()
    else:
        low = (code_bytes & 0x0F).to(torch.int16) - 8
        high = (code_bytes >> 4).to(torch.int16) - 8
        codes = torch.stack([low, high], dim=1).reshape(-1).float()
    values = codes.view(n_blocks, fmt.block) * scales[:, None]
    return values.reshape(-1)[:numel].to(dtype)


def error_bound(x: torch.Tensor, fmt: BlockFormat) -> torch.Tensor:
    """Per element of the flat `x`, the most dequantize(quantize(x)) can differ from it: max|block| / (2 qmax)."""
    half_step = _blocks(x, fmt).abs().amax(dim=1) / (2 * fmt.qmax)
    return half_step.repeat_interleave(fmt.block)[: x.numel()]
