"""fp16 loss scaling on an engine grid: torch.amp.GradScaler whose overflow check every rank of the grid agrees on.

torch's GradScaler checks each rank's own gradients for inf/NaN and skips the optimizer step where it finds one. On a
grid that goes wrong:

- a rank holds only its shards, so an overflow in one rank's shard makes that rank alone skip the step and lower its
  scale while the others step: the ranks' weights part silently;
- on a model engine.parallelize placed (every gradient a DTensor) DTensor reduces the flag over the mesh dims the
  FIRST gradient is sharded on and no others: right only when that gradient is split over every tensor axis (a
  vocabulary-parallel embedding at x=2), wrong when it is replicated (tests/parallel/test_grad_scaler.py).

GridGradScaler unscales every gradient's local shard and takes the maximum of the overflow flag over the whole grid
(one all-reduce of one float per unscale), so every rank skips the same steps and keeps the same scale. bf16 needs no
scaler: `--precision bf16` and Lightning's "bf16-mixed" do not use one.

A grid spans every process of torch.distributed's world (Grid refuses any other size), so the flag is reduced over the
default group.
"""

from __future__ import annotations

from typing import Any

import torch

from engine.core import comm
from engine.core.grid import Grid


class GridGradScaler(torch.amp.GradScaler):
    """torch.amp.GradScaler for a model parallelized on `grid`: the same scale, growth and backoff, with the
    inf/NaN check taken over every rank's shards (see the module doc). Use it as torch's: scale(loss).backward(),
    unscale_(optimizer) before clipping, step(optimizer), update(). Every rank of the grid must call unscale_ (or
    step, which calls it) at the same point: it is a collective.

    Args:
        grid: the grid the model was parallelized on.
        device: the gradients' device type; default the grid's.
        **kwargs: torch.amp.GradScaler's init_scale, growth_factor, backoff_factor, growth_interval, enabled.
    """

    def __init__(self, grid: Grid, device: str | None = None, **kwargs: Any) -> None:
        # the grid only names the device: the flag is reduced over the world, which a grid spans (and holding no
        # process group keeps the scaler picklable, as torch's is)
        super().__init__(device=device or grid.device.type, **kwargs)

    @classmethod
    def like(cls, scaler: torch.amp.GradScaler, grid: Grid, device: str | None = None) -> "GridGradScaler":
        """A GridGradScaler in `scaler`'s state: enabled or not, its scale, growth and backoff factors, growth interval
        and growth tracker (what the engine's Lightning strategies put in place of a precision plugin's scaler)."""
        if not scaler.is_enabled():
            return cls(grid, device, enabled=False)
        out = cls(grid, device)
        out.load_state_dict(scaler.state_dict())
        return out

    # torch's GradScaler.unscale_ calls this method to unscale the gradients and return the overflow flag per device;
    # torch's own ShardedGradScaler overrides it the same way (it is the one place both steps read the flags from).
    def _unscale_grads_(
        self, optimizer: torch.optim.Optimizer, inv_scale: torch.Tensor, found_inf: torch.Tensor, allow_fp16: bool
    ) -> dict[torch.device, torch.Tensor]:
        by_kind: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        with torch.no_grad():
            for group in optimizer.param_groups:
                for param in group["params"]:
                    if param.grad is None:
                        continue
                    # a DTensor's local shard (a placed parameter's, or ZeRO's): the flag is reduced below, over
                    # every rank, so no DTensor reduction is needed
                    grad = param.grad.to_local() if hasattr(param.grad, "to_local") else param.grad
                    if not allow_fp16 and grad.dtype == torch.float16:
                        raise ValueError("Attempting to unscale FP16 gradients.")  # torch's message and rule
                    if grad.is_sparse:  # as torch: the coalesced values (duplicate indices summed may overflow)
                        if grad.dtype == torch.float16:
                            param.grad = grad.float().coalesce().half()
                            grad = param.grad
                        grad = grad._values()
                    by_kind.setdefault((grad.device, grad.dtype), []).append(grad)
            flags: dict[torch.device, torch.Tensor] = {}
            for (device, _), grads in by_kind.items():
                flag = flags.setdefault(device, torch.zeros_like(found_inf, device=device))
                torch._amp_foreach_non_finite_check_and_unscale_(grads, flag, inv_scale.to(device))
            # a rank holding no gradient still takes part in the reduction, on the scale's device
            flags = flags or {found_inf.device: torch.zeros_like(found_inf)}
            overflow = torch.stack([f.to(found_inf.device) for f in flags.values()]).amax(0)
            comm.max_over_world(overflow)
            for flag in flags.values():
                flag.copy_(overflow)
        return flags
