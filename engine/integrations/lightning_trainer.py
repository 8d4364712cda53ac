"""A Lightning Trainer strategy on the engine's data x X x Y x Z grid (the Fabric one is engine.integrations.lightning).

    trainer = L.Trainer(accelerator="cpu", devices=4, strategy=EngineTrainerStrategy(x=2), gradient_clip_val=1.0)
    trainer.fit(module)          # the LightningModule holds an HF causal LM (any attribute name)

What it does to the Trainer's steps:

    setup            the LightningModule is moved to the device and sharded in place by engine.parallelize
                     (it finds the HF decoder stacks inside it), then configure_optimizers runs on the
                     parallel model's parameters
    backward         after each backward outside gradient accumulation: engine.sync_gradients, then the
                     mean over ranks (each rank runs the model on its own rows; like DDP)
    clipping         gradient_clip_val with the "norm" algorithm clips by the norm of the FULL model
                     (engine.clip_grad_norm_): Lightning routes it through the precision plugin, which only
                     sees the optimizer's local shards, so the plugin's clip_grad_by_norm is replaced
    checkpoints      trainer.save_checkpoint / ModelCheckpoint write an engine checkpoint folder (sharded
                     weights and optimizer state, atomic) with the rest of Lightning's checkpoint (loops,
                     schedulers, callbacks) as its extra state; fit(ckpt_path=...) restores it at any grid.
                     The weights are in the shards, so the dict's "state_dict" / "optimizer_states" stay empty.

Limits: one optimizer. The engine checkpoint holds the whole LightningModule;
engine.training.checkpoint.consolidate_checkpoint writes the HF model inside it (its one child with an HF config) as an
HF folder under the HF model's own key names, when no other tensor sits beside it.
"""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterator

import torch
from torch.optim import Optimizer

try:
    from lightning.fabric.utilities.distributed import _sync_ddp_if_available
    from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
    from lightning.pytorch.strategies.parallel import ParallelStrategy
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError('engine.integrations.lightning_trainer needs Lightning: pip install -e ".[lightning]"') from error

from engine.core import comm
from engine.core.grid import AXES, Grid
from engine.core.placement import refuse_mixed
from engine.integrations.lightning import StrategySettings, scale_over_grid, set_world_ranks
from engine.models.parallelize import parallelize
from engine.training import checkpoint as engine_checkpoint
from engine.training.state import clip_grad_norm_, sync_gradients


class EngineTrainerStrategy(ParallelStrategy):
    """Lightning Trainer strategy: the engine grid, parallel model, gradient sync, clipping and checkpoints.

    Args as engine.integrations.lightning.EngineStrategy: data (None: world / (x*y*z)), x, y, z, gradient_reduction
    ("mean" like DDP, or "sum"), overlap, process_group_backend, timeout.
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
    ) -> None:
        super().__init__()
        self._settings = StrategySettings(data, x, y, z, gradient_reduction, overlap, process_group_backend, timeout)
        self._grid: Grid | None = None
        self._skip_sync = False
        self.num_nodes = 1
        self.last_grad_norm: torch.Tensor | None = None  # the full model's gradient norm at the last clipping

    @property
    def grid(self) -> Grid:
        if self._grid is None:
            raise RuntimeError("the engine grid exists once the Trainer has started the processes")
        return self._grid

    @property
    def root_device(self) -> torch.device:
        devices = self.parallel_devices or [torch.device("cpu")]
        return torch.device("cpu") if devices[0].type == "cpu" else devices[self.local_rank]

    @property
    def num_processes(self) -> int:
        return len(self.parallel_devices) if self.parallel_devices is not None else 0

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        return True  # the engine loads into the parallel model and its optimizer

    @property
    def lightning_restore_optimizer(self) -> bool:
        return False

    def _configure_launcher(self) -> None:
        env = self.cluster_environment
        assert env is not None
        world = env.world_size() if env.creates_processes_externally else self.num_processes * self.num_nodes
        self._settings.shape(world)  # a grid that cannot fit fails when the Trainer is built
        if not env.creates_processes_externally:
            self._launcher = _SubprocessScriptLauncher(env, self.num_processes, self.num_nodes)

    def set_world_ranks(self) -> None:
        set_world_ranks(self)

    def setup_environment(self) -> None:
        super().setup_environment()
        self.set_world_ranks()
        assert self.cluster_environment is not None
        self._grid = self._settings.start_grid(self.cluster_environment, self.root_device)
        scale_over_grid(self.precision_plugin, self._grid, self.root_device)

    def setup(self, trainer: Any) -> None:
        from lightning.fabric.utilities.optimizer import _optimizers_to_device
        from lightning.pytorch.trainer.states import TrainerFn

        assert self.accelerator is not None and self.model is not None
        self.accelerator.setup(trainer)
        self.model = self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        parallelize(self.model, self.grid, overlap=self._settings.overlap)
        _clip_with_engine(self)
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
            for optimizer in self.optimizers:
                refuse_mixed(optimizer.param_groups, f"configure_optimizers' {type(optimizer).__name__}")
            if len(self.optimizers) > 1:
                raise ValueError(
                    "EngineTrainerStrategy trains with one optimizer; configure_optimizers returned "
                    f"{len(self.optimizers)}"
                )
        self.setup_precision_plugin()
        if trainer.state.fn == TrainerFn.FITTING:
            _optimizers_to_device(self.optimizers, self.root_device)

    def model_to_device(self) -> None:
        assert self.model is not None
        self.model.to(self.root_device)

    def post_backward(self, closure_loss: torch.Tensor) -> None:
        if self._skip_sync:
            return
        assert self.model is not None
        sync_gradients(self.model, self.grid)
        if self._settings.gradient_reduction == "mean" and self.grid.world_size > 1:
            for param in self.model.parameters():
                if param.grad is not None:
                    param.grad.div_(self.grid.world_size)

    @contextmanager
    def block_backward_sync(self) -> Iterator[None]:
        """Gradient accumulation: the backward calls inside skip the sync; the last micro-batch's syncs once."""
        self._skip_sync = True
        try:
            yield
        finally:
            self._skip_sync = False

    def reduce(self, tensor: Any, group: Any | None = None, reduce_op: Any = "mean") -> Any:
        if isinstance(tensor, torch.Tensor):
            return _sync_ddp_if_available(tensor, group, reduce_op=reduce_op)
        return tensor

    def barrier(self, name: str | None = None) -> None:
        if self._grid is not None:
            comm.barrier(self._grid.group(*AXES))

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if self._grid is None:
            return obj
        return comm.broadcast_object(obj, self._grid.group(*AXES), self._grid.device, src_group_rank=src)

    # ----- checkpoints: the weights and optimizer state go to the engine's shards --------------------------

    def lightning_module_state_dict(self) -> dict[str, Any]:
        return {}

    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        return {}

    def load_model_state_dict(self, checkpoint: Any, strict: bool = True) -> None:
        pass  # load_checkpoint already restored the weights

    def load_optimizer_state_dict(self, checkpoint: Any) -> None:
        pass  # load_checkpoint already restored the optimizer

    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: str | Path, storage_options: Any | None = None
    ) -> None:
        if storage_options is not None:
            raise TypeError("EngineTrainerStrategy.save_checkpoint takes no storage_options")
        path = Path(self.broadcast(str(filepath)))
        extra = {k: v for k, v in checkpoint.items() if k not in ("state_dict", "optimizer_states")}
        optimizer = self.optimizers[0] if self.optimizers else None
        engine_checkpoint.save_checkpoint(path, self.model, _unwrap(optimizer), self.grid, extra_state=extra)

    def load_checkpoint(self, checkpoint_path: str | Path, weights_only: bool | None = None) -> dict[str, Any]:
        path = Path(self.broadcast(str(checkpoint_path)))
        optimizer = self.optimizers[0] if self.optimizers else None
        extra = engine_checkpoint.load_checkpoint(path, self.model, _unwrap(optimizer), self.grid)
        return {**extra, "state_dict": {}, "optimizer_states": []}

    def remove_checkpoint(self, filepath: str | Path) -> None:
        if self.is_global_zero:
            shutil.rmtree(filepath, ignore_errors=True)

    def teardown(self) -> None:
        if self._grid is not None:
            self._grid.close()
            self._grid = None
        super().teardown()


def _unwrap(optimizer: Any) -> Optimizer | None:
    return getattr(optimizer, "_optimizer", optimizer)


def _clip_with_engine(strategy: EngineTrainerStrategy) -> None:
    """Make the precision plugin clip by the full model's norm.

    The Trainer clips through `precision_plugin.clip_grad_by_norm(optimizer, value)`, which sees only the
    optimizer's parameters (this rank's shards) and would compute a per-rank norm. The plugin's class is
    swapped for a subclass whose clip_grad_by_norm calls engine.clip_grad_norm_ on the strategy's model,
    keeping everything else the user's precision plugin does.
    """
    plugin = strategy.precision_plugin
    base = type(plugin)
    if getattr(base, "_engine_clipping", False):
        return

    def clip_grad_by_norm(self: Any, optimizer: Optimizer, clip_val: float) -> None:
        strategy.last_grad_norm = clip_grad_norm_(strategy.model, float(clip_val), strategy.grid)

    plugin.__class__ = type(
        f"Engine{base.__name__}",
        (base,),
        {"clip_grad_by_norm": clip_grad_by_norm, "_engine_clipping": True},
    )
