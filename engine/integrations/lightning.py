"""A Lightning Fabric strategy that trains on the engine's data x X x Y x Z grid.

    from lightning.fabric import Fabric
    from engine.integrations.lightning import EngineStrategy

    fabric = Fabric(accelerator="cpu", devices=4, strategy=EngineStrategy(x=2))   # data = 4 / 2 = 2
    fabric.launch()                                    # or run the script under torchrun / SLURM
    model, optimizer = fabric.setup(model, optimizer)  # engine.parallelize(model, grid), in place
    fabric.backward(loss)                              # then engine.sync_gradients (mean over ranks, like DDP)
    fabric.clip_gradients(model, optimizer, max_norm=1.0)   # engine.clip_grad_norm_: norm of the full model
    fabric.save("ckpt", {"model": model, "optimizer": optimizer, "step": 3})  # engine.training.checkpoint, sharded
    fabric.load("ckpt", state)                         # any grid: re-sharded when it differs
    consolidate_checkpoint("ckpt", "hf_folder")        # one process: an ordinary HF folder

Lightning's own ModelParallelStrategy (2.6) hands a function the model and a 2-D (data, tensor) DeviceMesh
and supports FSDP2 + DTensor only; this one hands the model to `engine.parallelize`, which splits every
Linear of each decoder layer over a 3-D tensor grid X x Y x Z and replicates it over the data axis.

What a rank sees: outside the decoder layers each rank works on its OWN rows of the batch (see
engine.parallelize), so seen from the training script the world does data parallelism over all
`world_size` ranks, whatever the grid: Fabric's distributed sampler gives every rank its own samples, and
after `fabric.backward(loss)` every gradient is the MEAN over ranks of the gradients of their local
losses, as with DDP (`gradient_reduction="sum"` gives the sum instead).

The Lightning Trainer's strategy is engine.integrations.lightning_trainer.EngineTrainerStrategy. Lightning is imported
here, never by `import engine`: install it with the `lightning` extra.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn
from torch.optim import Optimizer

try:
    from lightning.fabric.plugins.environments import ClusterEnvironment
    from lightning.fabric.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
    from lightning.fabric.strategies.parallel import ParallelStrategy
    from lightning.fabric.strategies.strategy import _BackwardSyncControl, _validate_keys_for_strict_loading
    from lightning.fabric.utilities.distributed import _init_dist_connection, _sync_ddp_if_available
    from lightning.fabric.utilities.rank_zero import rank_zero_only
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        'engine.integrations.lightning needs Lightning: pip install -e ".[lightning]" (lightning 2.6)'
    ) from error

from engine.core import comm
from engine.core.grid import AXES, Grid, GridError, GridShape, init
from engine.core.placement import refuse_mixed
from engine.models.parallelize import parallelize
from engine.training import checkpoint as engine_checkpoint
from engine.training.scaler import GridGradScaler
from engine.training.state import clip_grad_norm_, sync_gradients

# extra_state key under which save_checkpoint records which entries of Fabric's state were the model and optimizer
_KEYS = "_engine_lightning_keys"


def resolve_grid(world_size: int, data: int | None, x: int, y: int, z: int) -> GridShape:
    """The grid for `world_size` ranks; data None means world_size / (x*y*z). Raises GridError naming the fix."""
    tensor = x * y * z
    for axis, value in (("x", x), ("y", y), ("z", z)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise GridError(f"EngineStrategy: {axis} must be an integer >= 1, got {value!r}")
    if data is None:
        if world_size % tensor:
            raise GridError(
                f"EngineStrategy(x={x}, y={y}, z={z}) needs a multiple of {tensor} processes but the world "
                f"has {world_size}; launch a multiple of {tensor} processes (devices x num_nodes) or choose "
                f"x*y*z dividing {world_size}"
            )
        data = world_size // tensor
    shape = GridShape(data=data, x=x, y=y, z=z)
    if shape.world_size != world_size:
        raise GridError(
            f"EngineStrategy grid {shape} needs {shape.world_size} processes but the world has {world_size} "
            f"(devices x num_nodes, or the launcher's WORLD_SIZE); launch {shape.world_size} processes, "
            f"or choose sizes whose product is {world_size} (data=None fills the data axis)"
        )
    return shape


@dataclass(frozen=True)
class StrategySettings:
    """What the Fabric and the Trainer strategies are told about their grid and process group, validated when the
    strategy is built (see EngineStrategy's arguments)."""

    data: int | None
    x: int
    y: int
    z: int
    gradient_reduction: str = "mean"
    overlap: bool = True
    process_group_backend: str | None = None
    timeout: timedelta = timedelta(minutes=10)

    def __post_init__(self) -> None:
        if self.gradient_reduction not in ("mean", "sum"):
            raise ValueError(f"gradient_reduction must be 'mean' or 'sum', got {self.gradient_reduction!r}")
        GridShape(data=1 if self.data is None else self.data, x=self.x, y=self.y, z=self.z)  # each size, now
        if self.process_group_backend not in (None, "gloo", "nccl"):
            raise ValueError(f"process_group_backend must be 'gloo' or 'nccl', got {self.process_group_backend!r}")

    def shape(self, world_size: int) -> GridShape:
        """The grid over `world_size` ranks (see `resolve_grid`)."""
        return resolve_grid(world_size, self.data, self.x, self.y, self.z)

    def start_grid(self, cluster_environment: Any, device: torch.device) -> Grid:
        """Start torch.distributed from Lightning's cluster environment, then this rank's engine grid."""
        backend = self.process_group_backend or ("nccl" if device.type == "cuda" else "gloo")
        _init_dist_connection(cluster_environment, backend, timeout=self.timeout)
        shape = self.shape(torch.distributed.get_world_size())
        return init(data=shape.data, x=shape.x, y=shape.y, z=shape.z, backend=backend)


def scale_over_grid(precision: Any, grid: Grid, device: torch.device) -> None:
    """Give a precision plugin that scales the loss (Lightning's "16-mixed") a GridGradScaler with its scaler's
    settings: torch's GradScaler checks each rank's own shards for overflow, so ranks would skip different steps, and
    its unscale refuses placed and plain gradients together (engine/training/scaler.py)."""
    scaler = getattr(precision, "scaler", None)
    if isinstance(scaler, torch.amp.GradScaler) and not isinstance(scaler, GridGradScaler):
        precision.scaler = GridGradScaler.like(scaler, grid, device.type)


def set_world_ranks(strategy: Any) -> None:
    """A strategy's global rank and world size into its cluster environment, and Lightning's rank_zero_only."""
    if strategy.cluster_environment is not None:
        strategy.cluster_environment.set_global_rank(strategy.node_rank * strategy.num_processes + strategy.local_rank)
        strategy.cluster_environment.set_world_size(strategy.num_nodes * strategy.num_processes)
    rank_zero_only.rank = strategy.global_rank


class EngineStrategy(ParallelStrategy):
    """Fabric strategy: the engine's 4-D grid, parallel model, gradient sync, clipping and checkpoints.

    Args:
        data, x, y, z: grid axis sizes; data=None (default) takes world_size / (x*y*z). A grid whose product
            is not the world size is refused when Fabric is built (the world is then known from devices x
            num_nodes or from the launcher's environment), naming the fix.
        gradient_reduction: "mean" (default, like DDP: the gradient of the mean of the ranks' local losses)
            or "sum" (the gradient of their sum, as engine.sync_gradients leaves it).
        overlap: passed to engine.parallelize (prefetch the next layer's weights during the current one).
        process_group_backend: "gloo" or "nccl"; default nccl for CUDA devices, gloo otherwise.
    """

    def __init__(
        self,
        data: int | None = None,
        x: int = 1,
        y: int = 1,
        z: int = 1,
        *,
        gradient_reduction: str = "mean",
        overlap: bool = True,
        process_group_backend: str | None = None,
        timeout: timedelta = timedelta(minutes=10),
        accelerator: Any = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        precision: Any = None,
    ) -> None:
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            precision=precision,
        )
        self._settings = StrategySettings(data, x, y, z, gradient_reduction, overlap, process_group_backend, timeout)
        self._grid: Grid | None = None
        self._module: nn.Module | None = None
        self._skip_sync = False
        self._num_nodes = 1
        self._backward_sync_control = _EngineBackwardSync(self)

    # ----- world and devices ------------------------------------------------------------------------------

    @property
    def grid(self) -> Grid:
        """This rank's engine grid (available after `fabric.launch()`)."""
        if self._grid is None:
            raise RuntimeError("the engine grid exists once the processes are started: call fabric.launch() first")
        return self._grid

    @property
    def root_device(self) -> torch.device:
        devices = self.parallel_devices or [torch.device("cpu")]
        if devices[0].type == "cpu":
            return torch.device("cpu")
        return devices[self.local_rank]

    @property
    def num_nodes(self) -> int:
        return self._num_nodes

    @num_nodes.setter
    def num_nodes(self, num_nodes: int) -> None:
        self._num_nodes = num_nodes

    @property
    def num_processes(self) -> int:
        return len(self.parallel_devices) if self.parallel_devices is not None else 0

    def _world_size_to_be(self) -> int:
        env = self.cluster_environment
        if env is not None and env.creates_processes_externally:
            return env.world_size()
        return self.num_processes * self.num_nodes

    def _configure_launcher(self) -> None:
        # Called while Fabric is built: the world is known, so a grid that cannot fit fails here, at once.
        self._shape = self._settings.shape(self._world_size_to_be())
        assert self.cluster_environment is not None
        if not self.cluster_environment.creates_processes_externally:
            self._launcher = _SubprocessScriptLauncher(self.cluster_environment, self.num_processes, self.num_nodes)

    def setup_environment(self) -> None:
        super().setup_environment()
        set_world_ranks(self)
        self._grid = self._settings.start_grid(self.cluster_environment, self.root_device)
        scale_over_grid(self.precision, self._grid, self.root_device)

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        # Every rank runs the model on its own rows (see the module doc): a sampler replica per rank.
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    # ----- model -------------------------------------------------------------------------------------------

    def setup_module(self, module: nn.Module) -> nn.Module:
        """Shard `module` in place for the grid (engine.parallelize; weights kept exactly) and return it."""
        if self._module is not None and self._module is not module:
            raise ValueError(
                "EngineStrategy trains one model: fabric.setup was already called with another module; "
                "put both in one nn.Module"
            )
        self._module = parallelize(module, self.grid, overlap=self._settings.overlap)
        return self._module

    def setup_module_and_optimizers(
        self, module: nn.Module, optimizers: list[Optimizer], scheduler: Any = None
    ) -> tuple[nn.Module, list[Optimizer], Any]:
        """Parallelize the module; the optimizers must hold the PARALLEL model's parameters, so they can only be
        built after it: fabric.setup_module(model), then the optimizer, then fabric.setup_optimizers(optimizer)."""
        module = self.setup_module(module)
        current = {id(p) for p in module.parameters()}
        for optimizer in optimizers:
            stale = sum(1 for g in optimizer.param_groups for p in g["params"] if id(p) not in current)
            if stale:
                raise ValueError(
                    f"the optimizer holds {stale} parameters that engine.parallelize replaced by "
                    "their shards; call model = fabric.setup_module(model) first, build the optimizer "
                    "from model.parameters(), then optimizer = fabric.setup_optimizers(optimizer)"
                )
        return module, optimizers, scheduler

    def setup_optimizer(self, optimizer: Optimizer) -> Optimizer:
        refuse_mixed(optimizer.param_groups, f"the {type(optimizer).__name__}")
        return super().setup_optimizer(optimizer)

    def module_to_device(self, module: nn.Module) -> None:
        module.to(self.root_device)

    def backward(self, tensor: torch.Tensor, module: nn.Module | None, *args: Any, **kwargs: Any) -> None:
        """Backward, then (outside fabric.no_backward_sync) the engine's gradient sync over the grid."""
        super().backward(tensor, module, *args, **kwargs)
        if self._skip_sync or self._module is None:
            return
        sync_gradients(self._module, self.grid)
        if self._settings.gradient_reduction == "mean" and self.grid.world_size > 1:
            scale = 1.0 / self.grid.world_size
            for param in self._module.parameters():
                if param.grad is not None:
                    param.grad.mul_(scale)

    def clip_gradients_norm(
        self,
        module: nn.Module,
        optimizer: Optimizer,
        max_norm: float | int,
        norm_type: float | int = 2.0,
        error_if_nonfinite: bool = True,
    ) -> torch.Tensor:
        """Clip by the 2-norm of the FULL model's gradient (shards summed over the tensor axes, replicas once)."""
        self.precision.unscale_gradients(optimizer)
        norm = clip_grad_norm_(module, float(max_norm), self.grid, norm_type=float(norm_type))
        if error_if_nonfinite and not torch.isfinite(norm):
            raise RuntimeError(
                f"the total gradient norm is {float(norm)}; the gradients cannot be clipped (pass "
                "error_if_nonfinite=False to clip anyway)"
            )
        return norm

    # ----- collectives -------------------------------------------------------------------------------------

    def all_reduce(self, tensor: Any, group: Any | None = None, reduce_op: Any = "mean") -> Any:
        if isinstance(tensor, torch.Tensor):
            return _sync_ddp_if_available(tensor, group, reduce_op=reduce_op)
        return tensor

    def barrier(self, *args: Any, **kwargs: Any) -> None:
        if self._grid is not None:
            comm.barrier(self._grid.group(*AXES))

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if self._grid is None:
            return obj
        return comm.broadcast_object(obj, self._grid.group(*AXES), self._grid.device, src_group_rank=src)

    # ----- checkpoints -------------------------------------------------------------------------------------

    @property
    def checkpoint_io(self) -> Any:
        raise NotImplementedError(
            "EngineStrategy writes engine checkpoints (engine.training.checkpoint), not CheckpointIO files"
        )

    @checkpoint_io.setter
    def checkpoint_io(self, io: Any) -> None:
        if io is not None:
            raise NotImplementedError(
                "EngineStrategy does not take a CheckpointIO plugin; it writes engine checkpoints"
            )

    def save_checkpoint(
        self,
        path: str | Path,
        state: dict[str, Any],
        storage_options: Any | None = None,
        filter: dict[str, Callable[[str, Any], bool]] | None = None,
    ) -> None:
        """Write `state` as an engine checkpoint FOLDER at `path` (sharded weights and AdamW state, atomic).

        state: the model set up by this strategy, at most one optimizer, and any other entries (ints, dicts,
            objects with state_dict(), e.g. an LR scheduler), stored as the checkpoint's extra state: JSON and
            safetensors, never pickled, so it may hold tensors, numbers, strings, None and lists, tuples or dicts of
            them (anything else is refused with CheckpointError).
        """
        if storage_options is not None or filter is not None:
            raise TypeError(
                "EngineStrategy.save_checkpoint takes no storage_options or filter: the engine writes the "
                "whole model and optimizer"
            )
        model_key, optimizer_key, extra = self._split_state(state)
        extra[_KEYS] = {"model": model_key, "optimizer": optimizer_key}
        path = Path(self.broadcast(str(path)))
        engine_checkpoint.save_checkpoint(
            path, state[model_key], state[optimizer_key] if optimizer_key else None, self.grid, extra_state=extra
        )

    def load_checkpoint(
        self,
        path: str | Path,
        state: nn.Module | Optimizer | dict[str, Any] | None = None,
        strict: bool = True,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        """Restore an engine checkpoint into `state` in place (at any grid); return the entries not restored.

        state: {"model": model, "optimizer": optimizer, ...} (other keys are filled from the extra state, objects
            with load_state_dict() loaded), or the model alone (weights only).
        """
        if not state:
            raise ValueError(
                "EngineStrategy.load_checkpoint needs the model to load into: "
                "fabric.load(path, {'model': model, 'optimizer': optimizer, ...})"
            )
        path = Path(self.broadcast(str(path)))
        if isinstance(state, nn.Module):
            engine_checkpoint.load_checkpoint(path, state, None, self.grid)
            return {}
        if isinstance(state, Optimizer):
            raise NotImplementedError(
                "EngineStrategy loads an optimizer together with its model: "
                "fabric.load(path, {'model': model, 'optimizer': optimizer})"
            )
        model_key, optimizer_key, _ = self._split_state(state)
        extra = dict(
            engine_checkpoint.load_checkpoint(
                path, state[model_key], state[optimizer_key] if optimizer_key else None, self.grid
            )
        )
        saved_keys = extra.pop(_KEYS, {})
        if optimizer_key is not None and saved_keys.get("optimizer") is None:
            raise ValueError(f"checkpoint {path} holds no optimizer state; load it without the optimizer")
        available = set(extra) | {k for k in (saved_keys.get("model"), saved_keys.get("optimizer")) if k}
        requested = [k for k in state if k not in (model_key, optimizer_key)] + [model_key]
        _validate_keys_for_strict_loading(requested, available | {model_key}, strict=strict)
        for key in list(state):
            if key in (model_key, optimizer_key) or key not in extra:
                continue
            value = extra.pop(key)
            if hasattr(state[key], "load_state_dict") and not isinstance(state[key], (nn.Module, Optimizer)):
                state[key].load_state_dict(value)
            else:
                state[key] = value
        return extra

    def _split_state(self, state: dict[str, Any]) -> tuple[str, str | None, dict[str, Any]]:
        """(key of the model, key of the optimizer or None, every other entry converted to plain state)."""
        models = [k for k, v in state.items() if isinstance(v, nn.Module)]
        optimizers = [k for k, v in state.items() if isinstance(v, Optimizer)]
        if len(models) != 1:
            raise ValueError(
                f"EngineStrategy checkpoints hold exactly one model, the state has {len(models)} "
                f"({models}); save each model with its own fabric.save call"
            )
        if self._module is not None and state[models[0]] is not self._module:
            raise ValueError(
                f"state[{models[0]!r}] is not the model set up by this strategy; pass the model that "
                "fabric.setup returned"
            )
        if len(optimizers) > 1:
            raise ValueError(f"EngineStrategy checkpoints hold at most one optimizer, the state has {optimizers}")
        extra = {}
        for key, value in state.items():
            if key in models or key in optimizers:
                continue
            extra[key] = value.state_dict() if hasattr(value, "state_dict") and callable(value.state_dict) else value
        return models[0], (optimizers[0] if optimizers else None), extra

    def teardown(self) -> None:
        if self._grid is not None:
            self._grid.close()
            self._grid = None
        self.precision.teardown()
        if self.accelerator is not None:
            self.accelerator.teardown()
        if self.cluster_environment is not None:
            self.cluster_environment.teardown()


class _EngineBackwardSync(_BackwardSyncControl):
    """fabric.no_backward_sync(model): skip the gradient sync of the backward calls inside the block (gradient
    accumulation); the first backward outside it syncs the accumulated gradients once."""

    def __init__(self, strategy: EngineStrategy) -> None:
        self._strategy = strategy

    def no_backward_sync(self, module: nn.Module, enabled: bool) -> AbstractContextManager:
        if not enabled:
            return nullcontext()
        strategy = self._strategy

        class _Skip(AbstractContextManager):
            def __enter__(self) -> None:
                strategy._skip_sync = True

            def __exit__(self, *exc: object) -> None:
                strategy._skip_sync = False

        return _Skip()


def consolidate_checkpoint(path: str | Path, out_dir: str | Path) -> Path:
    """Merge a checkpoint written by fabric.save with EngineStrategy into an ordinary HF folder (one process,
    no torch.distributed): out_dir/model.safetensors + config.json, loadable by
    AutoModelForCausalLM.from_pretrained(out_dir)."""
    return engine_checkpoint.consolidate_checkpoint(path, out_dir)
