"""Activation offload: the tensors autograd saves for backward kept in host memory (AxoNN 2022's CPU memory as
scratch space), and the count of what they would have held on the device.

    offload = ActivationOffload(enabled=True, device=torch.device("cuda"))   # once per run
    offload.reset(model.parameters())                # each step: sums to 0; the parameters stay where they are
    with offload:                                    # around a micro-batch's forward AND backward (or a pipeline step)
        loss = model(ids).loss
        loss.backward()
    offload.stats.saved_peak_bytes, offload.stats.device_peak_bytes          # bytes

Built on torch's saved-tensor hooks (torch.autograd.graph.saved_tensors_hooks, the machinery of torch's own
save_on_cpu): every tensor autograd saves during the block goes through `pack`, and backward gets it back through
`unpack`. What differs from save_on_cpu:

- Parameters (and views of them: a Linear saves `weight.t()`) stay where they are: they live on the device anyway,
  so copying them would move bytes and save nothing. This also leaves FSDP2's gathered parameters to FSDP (ZeRO 3
  frees and re-gathers them itself).
- One host copy per device storage, not per saved tensor: a Linear's input is saved by the op before it (a ReLU's
  output, a norm's) and by the Linear, and q/k/v projections save one input three times; save_on_cpu copies each.
  The whole storage is copied (the bytes the graph would have kept alive) and each saved view is rebuilt on it.
- Counted: the bytes of distinct storages the graph holds at once, with and without offload (`OffloadStats`).

On a CUDA device the host copies are pinned and the device-to-host copy is asynchronous on the current stream (as
save_on_cpu with pin_memory=True): the caching allocator reuses a freed activation's block only for work queued
after the copy, so the copy is safe, but it shares the stream with compute and overlaps nothing; overlapping it needs
a side stream, which this module does not do. On a CPU device host = device: nothing is copied (unless `host_copy`),
and the figures say what an accelerator run of the same step would keep on the device and move.

Composes with (tests/unit/test_activation_offload.py, tests/parallel/test_offload_activations.py):
- activation checkpointing (engine/memory/activation.py, torch's non-reentrant checkpoint): inside a checkpointed
  layer checkpoint's own saved-tensor hooks sit on top of the stack and keep nothing, so only what checkpoint saves
  through the default hooks (each layer's inputs, `_make_saved_tensor`) and the saves outside the layers reach these
  hooks; the recomputation in backward runs under checkpoint's hooks and is neither offloaded nor counted.
- FSDP2 (engine/memory/zero.py): its unsharded parameters are nn.Parameters, left alone as above.
- torch.distributed.pipelining (engine/training/pipeline.py) with the block around `Pipeline.step`: every stage's
  forward saves through the hooks, so the in-flight micro-batches' activations are offloaded and counted; a received
  activation lives in a receive buffer torch keeps per micro-batch, so its host copy frees nothing on the device.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Iterable

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

from engine.core.placement import local_shard


@dataclass
class OffloadStats:
    """Saved-for-backward activations seen by the hooks in the blocks since the last `reset` (bytes; parameters are
    not activations and are not counted).

    saved_peak_bytes: most bytes of distinct storages the autograd graph held at once: what would stay on the
        device at the step's peak without offload.
    device_peak_bytes: most of those bytes resident on the device at once with this setting. With offload: the
        storages copied back for backward that are alive at once (each until its last saver's backward is done),
        nothing from the forward.
    host_peak_bytes: most bytes of host copies held at once.
    offloaded_bytes: bytes put in host memory (device -> host copies on an accelerator), summed.
    restored_bytes: bytes brought back for backward (host -> device copies on an accelerator), summed: once per
        storage, however many backward nodes unpack it.
    saved_tensors: activations packed (one storage saved by several ops counts each time).
    """

    saved_peak_bytes: int = 0
    device_peak_bytes: int = 0
    host_peak_bytes: int = 0
    offloaded_bytes: int = 0
    restored_bytes: int = 0
    saved_tensors: int = 0

    @property
    def device_bytes_saved(self) -> int:
        """Device bytes that offload spared at the peak of saved activations: saved_peak - device_peak."""
        return self.saved_peak_bytes - self.device_peak_bytes


class _Storage:
    """One device storage (at one version) saved for backward: its bytes, its live holders and, offloaded, its host
    copy as a flat uint8 tensor. `weak` pins the StorageImpl's address (its key) while the entry lives, so a new
    storage allocated where a freed one was cannot be mistaken for it."""

    __slots__ = ("key", "nbytes", "holders", "host", "restored", "weak")

    def __init__(self, key: tuple[int, int], nbytes: int, weak: StorageWeakRef) -> None:
        self.key, self.nbytes, self.holders, self.weak = key, nbytes, 0, weak
        self.host: torch.Tensor | None = None
        self.restored: torch.Tensor | None = None  # the copy back on the device, shared by the storage's views


class _Saved:
    """What autograd keeps for one saved tensor: the tensor itself (counting only) or where its view lies in its
    storage's host copy. Freed by autograd with the graph node; then its storage entry loses a holder."""

    __slots__ = ("owner", "entry", "tensor", "version", "offset", "size", "stride", "dtype")

    def __init__(self, owner: "_Hooks", entry: _Storage, tensor: torch.Tensor | None, view: torch.Tensor) -> None:
        self.owner, self.entry, self.tensor, self.version = owner, entry, tensor, view._version
        self.offset, self.size, self.stride, self.dtype = view.storage_offset(), view.size(), view.stride(), view.dtype

    def __del__(self) -> None:
        self.owner.release(self.entry)


class _Hooks:
    """The pack/unpack pair and the counts behind `ActivationOffload` and `SavedActivations`.

    move=False: saved tensors stay as they are, only counted. move=True: each saved storage on `device` is held in
    host memory (copied there unless the device is the host and host_copy is False).
    """

    def __init__(self, device: torch.device, *, move: bool, pin_memory: bool, host_copy: bool) -> None:
        self.device, self.move, self.pin_memory, self.host_copy = device, move, pin_memory, host_copy
        self.stats = OffloadStats()
        self.entries: dict[tuple[int, int], _Storage] = {}
        self.kept: set[int] = set()  # storages of parameters (by _cdata) that stay in place, see _Block.reset
        self.saved_now = self.device_now = self.host_now = 0
        self.lock = threading.RLock()  # releases come from autograd's device threads, and from GC inside a pack

    def _is_activation(self, t: torch.Tensor) -> bool:
        # plain strided tensors on the compute device; subclasses, sparse, nested and meta tensors pass through
        if not (type(t) is torch.Tensor and t.layout == torch.strided and t.device.type == self.device.type):
            return False
        base = t._base if t._base is not None else t
        # parameters and views of them, a placed parameter's local shard recognised by its storage, stay in place
        parameter = isinstance(base, nn.Parameter) or isinstance(t, nn.Parameter)
        return not (parameter or t.untyped_storage()._cdata in self.kept)

    def pack(self, t: torch.Tensor) -> Any:
        if not self._is_activation(t):
            return t
        storage = t.untyped_storage()
        # counting only: one entry per storage; moved: per storage and version (an in-place change after a copy
        # was taken needs a new copy)
        key = (storage._cdata, t._version if self.move else 0)
        with self.lock:
            self.stats.saved_tensors += 1
            entry = self.entries.get(key)
            if entry is None:
                entry = _Storage(key, storage.nbytes(), StorageWeakRef(storage))
                self.entries[key] = entry
                self._add(entry)
            entry.holders += 1
        if self.move and entry.host is None:
            entry.host = self._to_host(t)
        copied = self.move and entry.host.untyped_storage().data_ptr() != storage.data_ptr()
        # kept: a detached alias (same storage and version counter, no grad_fn). The tensor itself would close a
        # cycle through C++ (output -> its grad_fn -> the saved variable -> this holder -> output) that Python's
        # collector cannot see, leaking every graph that is never run backward
        return _Saved(self, entry, None if copied else t.detach(), t)

    def _to_host(self, t: torch.Tensor) -> torch.Tensor:
        """The whole storage of `t` as a flat uint8 tensor in host memory (the storage itself when the device is the
        host and no copy is asked for)."""
        flat = torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())
        if t.device.type == "cpu" and not self.host_copy:
            return flat
        host = torch.empty(flat.shape, dtype=torch.uint8, pin_memory=self.pin_memory)
        return host.copy_(flat, non_blocking=self.pin_memory)

    def unpack(self, saved: Any) -> torch.Tensor:
        if not isinstance(saved, _Saved):
            return saved
        if saved.tensor is not None and saved.tensor._version != saved.version:
            # autograd skips its own in-place check for hooked tensors; without hooks this step would raise it
            raise RuntimeError(
                f"a tensor of shape {tuple(saved.size)} saved for backward was modified by an inplace operation "
                f"(version {saved.version} -> {saved.tensor._version})"
            )
        if not self.move:
            return saved.tensor
        entry = saved.entry
        with self.lock:
            if entry.restored is None:
                # one copy back per storage, kept until its last saver's backward is done: the device then holds
                # no more than it would have without offload, and views saved by several ops are copied once
                host, pin = entry.host, self.pin_memory
                entry.restored = host if self.device.type == "cpu" else host.to(self.device, non_blocking=pin)
                self.stats.restored_bytes += entry.nbytes
                self.device_now += entry.nbytes
                self.stats.device_peak_bytes = max(self.stats.device_peak_bytes, self.device_now)
            flat = entry.restored
        if saved.tensor is not None:  # the host is the device and nothing was copied: the tensor itself
            return saved.tensor
        view = torch.empty(0, dtype=saved.dtype, device=flat.device)
        return view.set_(flat.untyped_storage(), saved.offset, saved.size, saved.stride)

    def _add(self, entry: _Storage) -> None:
        stats = self.stats
        self.saved_now += entry.nbytes
        stats.saved_peak_bytes = max(stats.saved_peak_bytes, self.saved_now)
        if self.move:
            self.host_now += entry.nbytes
            stats.offloaded_bytes += entry.nbytes
            stats.host_peak_bytes = max(stats.host_peak_bytes, self.host_now)
        else:
            self.device_now += entry.nbytes
            stats.device_peak_bytes = max(stats.device_peak_bytes, self.device_now)

    def release(self, entry: _Storage) -> None:
        with self.lock:
            entry.holders -= 1
            if entry.holders:
                return
            del self.entries[entry.key]
            self.saved_now -= entry.nbytes
            if self.move:
                self.host_now -= entry.nbytes
            if not self.move or entry.restored is not None:
                self.device_now -= entry.nbytes
        entry.host = entry.restored = entry.weak = None  # copies and the pinned address go with the last holder

    def reset(self, parameters: Iterable[torch.Tensor]) -> None:
        with self.lock:
            self.kept = {local_shard(p).untyped_storage()._cdata for p in parameters}
            self.stats = OffloadStats(
                saved_peak_bytes=self.saved_now, device_peak_bytes=self.device_now, host_peak_bytes=self.host_now
            )


class _Block:
    """A context manager pushing `hooks` (when given) onto autograd's saved-tensor hooks for the block; re-entrant."""

    def __init__(self, hooks: _Hooks | None) -> None:
        self._hooks = hooks
        self._contexts: list[torch.autograd.graph.saved_tensors_hooks] = []

    @property
    def stats(self) -> OffloadStats:
        """The counts since the last `reset` (all zero when nothing was hooked)."""
        return self._hooks.stats if self._hooks is not None else OffloadStats()

    def reset(self, parameters: Iterable[torch.Tensor] = ()) -> None:
        """Start a new step: sums to 0, peaks to what is held now (normally 0: the last backward freed all).
        `parameters` (the model's) stay in place: a placed (DTensor) parameter computes on views of its local shard,
        which are not nn.Parameters, so their storages are recognised instead."""
        if self._hooks is not None:
            self._hooks.reset(parameters)

    def __enter__(self) -> "_Block":
        if self._hooks is not None:
            context = torch.autograd.graph.saved_tensors_hooks(self._hooks.pack, self._hooks.unpack)
            context.__enter__()
            self._contexts.append(context)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._hooks is not None:
            self._contexts.pop().__exit__(*exc)


class ActivationOffload(_Block):
    """`with offload:` keeps the activations that autograd saves for backward in host memory (pinned on CUDA) and
    counts them in `stats` (OffloadStats: bytes). Built once per run; `reset()` at each step.

    enabled=False pushes no hook: the block changes nothing and costs nothing, and `stats` stays zero.
    `device` is the compute device; saved tensors elsewhere, parameters and tensor subclasses stay as they are.
    pin_memory: pinned host copies with asynchronous copies (default: when `device` is CUDA).
    host_copy: copy to a separate host buffer even when the device is the host (CPU); tests use it to run the copy
        path. Gradients are bit for bit those without offload: the copies are exact and the strides are kept.
    """

    def __init__(
        self, enabled: bool, device: torch.device, *, pin_memory: bool | None = None, host_copy: bool = False
    ) -> None:
        device = torch.device(device)
        pin = device.type == "cuda" if pin_memory is None else pin_memory
        super().__init__(_Hooks(device, move=True, pin_memory=pin, host_copy=host_copy) if enabled else None)
        self.enabled, self.device = enabled, device


class SavedActivations(_Block):
    """`with counter:` counts the activations autograd saves for backward on `device` without moving them:
    `stats.saved_peak_bytes` (= device_peak_bytes) is what a step keeps for backward at its peak. For comparisons
    with ActivationOffload (the same counting)."""

    def __init__(self, device: torch.device) -> None:
        device = torch.device(device)
        super().__init__(_Hooks(device, move=False, pin_memory=False, host_copy=False))
        self.device = device
