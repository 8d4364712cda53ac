"""The planner's shape of a model family, derived from the model itself: built on the meta device from its config
and read as parallelize shards it, not written down in a second table.

engine.planner.cost_model computes bytes, parameters and memory from a TransformerShape; this module fills one from a
transformers causal LM: its decoder layers and tensor-parallel plan (engine.models.adapter and the family's adapter),
each parameter as the engine places it (the projections of the plan, sharded over x, y and z; the modules beside them
that run on a y rank's heads: per-head norms, and RMSNorms over a whole projection that reduce their statistics over
y; the other parameters of a layer, replicated; outside the layers the embeddings and lm_head, split by vocabulary,
and the rest: final norms, position tables), which loss `goldfish train` runs for it (the engine's own test, on a CPU
miniature of the config), and the engine's own refusals (parallelize's checks, the pipeline's stage check) for the
grids it cannot take. `goldfish plan --model FOLDER_OR_CONFIG` asks it through engine.planner_shape.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from engine.core.linear import ShardingError
from engine.core.vocab_parallel import can_shard_vocab, causal_lm_token_losses
from engine.models.adapter import find_planned, head_counts
from engine.models.miniature import miniature_config
from engine.models.parallelize import beside_kind, fused_sizes, refuse_other_lookups, refuse_unconfirmed_fusion
from engine.models.stages import check_model
from engine.planner.cost_model import LayerParam, TransformerShape
from engine.spec import GridShape


def planner_shape(config: Any, name: str = "") -> TransformerShape:
    """The planner's shape of the causal LM of transformers `config`, built on the meta device (no weights allocated,
    no remote code run) and read as parallelize would shard it (model_planner_shape). ValueError (one line) for a
    config of no causal LM, or of a model the engine cannot shard on any grid."""
    from transformers import AutoModelForCausalLM  # on use, as the adapter reads transformers

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    except (ValueError, KeyError, TypeError) as error:
        first = " ".join(str(error).split())[:200]
        raise ValueError(
            f"cannot build a causal LM of model_type {getattr(config, 'model_type', None)!r} from its config "
            f"({first}); give a decoder-only language model's config"
        ) from error
    try:
        return model_planner_shape(model, name or getattr(config, "model_type", ""))
    except (AttributeError, TypeError, KeyError) as error:  # a family whose modules the plan does not describe
        raise ValueError(
            f"{getattr(config, 'model_type', None)}: the planner cannot read its layers as the engine's plan names "
            f"them ({type(error).__name__}: {' '.join(str(error).split())[:200]})"
        ) from error


def _takes_logits(config: Any) -> bool:
    """Whether the engine's training loss takes model(...).logits for this family instead of the chunked loss: its own
    test (causal_lm_token_losses turns the lm_head into a loss head, and marks it when the model changes the logits
    after it; a head with a bias stays as it is), run once on a CPU miniature of `config` (engine.models.miniature)."""
    from transformers import AutoModelForCausalLM

    try:
        miniature = AutoModelForCausalLM.from_config(miniature_config(config))
        ids = torch.zeros(1, 4, dtype=torch.long)
        with torch.no_grad():
            causal_lm_token_losses(miniature, ids, ids)
    except Exception as error:  # noqa: BLE001 - any failure of the family's code: refuse in one line
        raise ValueError(
            f"{getattr(config, 'model_type', None)}: a miniature of the model does not run on the CPU "
            f"({type(error).__name__}: {' '.join(str(error).split())[:160]}), so the planner cannot tell which loss "
            "the engine runs; plan a named size or another family"
        ) from error
    return getattr(miniature.get_output_embeddings(), "transforms_logits", True)


def model_planner_shape(model: nn.Module, name: str = "") -> TransformerShape:
    """The planner's shape of `model` (a transformers causal LM, on any device, e.g. meta) as parallelize shards it.

    ValueError (one line) for a model the engine cannot shard on any grid; grids it refuses only on some axes become
    the shape's refusals (the planner rejects those grids with the engine's reason)."""
    found = find_planned(model)
    if len(found) != 1:
        raise ValueError(
            f"{type(model).__name__}: the engine finds {len(found) or 'no'} base models with a plan of decoder "
            "layers (engine/models/adapter.py); give a model of a family that declares a tensor-parallel plan"
        )
    stack_name, stack, plan = found[0]
    family, config = plan.family, stack.config
    if plan.unsupported or not plan.projections:
        why = "entries it cannot map, e.g. mixture-of-experts" if plan.unsupported else "no tensor-parallel plan"
        raise ValueError(
            f"{family}: its plan has {why}, so the engine trains it with data parallelism only, and the planner's "
            "cost model counts the dense layers of a tensor-parallel plan; plan it with a dense family of its sizes"
        )
    layers = getattr(stack, plan.layers)
    signature = [(n, tuple(p.shape)) for n, p in layers[0].named_parameters()]
    if any([(n, tuple(p.shape)) for n, p in layer.named_parameters()] != signature for layer in layers):
        raise ValueError(f"{family}: its decoder layers differ in their parameters; the planner needs equal layers")
    heads, kv_heads, head_dim = head_counts(config)
    layer = layers[0]
    where = f"{stack_name}.{plan.layers}.0" if stack_name else f"{plan.layers}.0"
    planned = {p.path: p for p in plan.projections}
    widths: dict[str, set[int]] = {}  # per projection parent: the widths of its normal projections
    fused_blocks, refusals = [], []
    for path, projection in planned.items():
        parent_path, _, attr = path.rpartition(".")
        module = layer.get_submodule(path)
        out = module.weight.shape[0] if type(module).__name__ != "Conv1D" else module.weight.shape[1]
        if projection.mode == "normal":
            widths.setdefault(parent_path, set()).add(out)
        if projection.fused is not None:  # the engine's shape check (a ShardingError is a ValueError)
            blocks = fused_sizes(projection.fused, out, config, f"{family}: {where}.{path}")
            if projection.fused != "per_head":  # per-head slices are whole heads: the head count check covers them
                fused_blocks.append(tuple(blocks))
        if projection.mode == "normal" and projection.fused is None:
            try:  # the engine's own test of a projection that looks fused without a confirmed layout
                refuse_unconfirmed_fusion(module, attr, family, config, f"{where}.{path}")
            except ShardingError as error:
                refusals.append((("y",), str(error)))
            except Exception as error:  # noqa: BLE001 - parallelize turns any error here into a refusal as well
                why = f"{type(error).__name__} while planning it: {' '.join(str(error).split())}"
                refusals.append((("y",), f"{family}: the engine cannot shard {where}.{path} ({why})"))
    beside: dict[str, str] = {}  # parameter name -> kind, for the modules beside the projections (region "heads")
    for parent_path in {path.rpartition(".")[0] for path in planned}:
        parent = layer.get_submodule(parent_path)
        if list(parent.parameters(recurse=False)):
            raise ValueError(f"{where}.{parent_path}: {type(parent).__name__} holds parameters the engine cannot shard")
        prefix = f"{parent_path}." if parent_path else ""
        for child_name, child in parent.named_children():
            if f"{prefix}{child_name}" in planned or not list(child.parameters()):
                continue
            kind = beside_kind(child, widths.get(parent_path, set()), head_dim, 1)  # parallelize's own test
            if kind is None:
                where_child = f"{where}.{prefix}{child_name} ({type(child).__name__})"
                raise ValueError(f"{where_child} has parameters the engine cannot shard by heads")
            for param_name, _ in child.named_parameters():  # per-head norms and head rows: replicated
                beside[f"{prefix}{child_name}.{param_name}"] = "y_norm" if kind == "y_norm" else "replicated"
    layout = []
    for param_name, param in layer.named_parameters():
        module_path, _, attr = param_name.rpartition(".")
        if module_path in planned:
            if attr == "weight":
                module = layer.get_submodule(module_path)
                out, inp = param.shape if type(module).__name__ != "Conv1D" else param.shape[::-1]
                transposed = planned[module_path].mode == "transposed"
                layout.append(LayerParam("projection", out, inp, transposed, module.bias is not None, name=module_path))
            continue
        kind, region = (beside[param_name], "heads") if param_name in beside else ("replicated", "layer")
        rows = param.shape[0] if param.dim() else 1
        layout.append(LayerParam(kind, rows, param.numel() // rows, region=region, name=param_name))
    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    vocab_weights = {id(embedding.weight)} | ({id(head.weight)} if head is not None else set())
    in_stack = {id(p) for p in stack.parameters()}
    in_layers = {id(p) for p in layers.parameters()}
    before, after, passed = [], [], False  # in module order, the parameters before and after the decoder layers
    for param_name, param in model.named_parameters():
        if id(param) in in_layers:
            passed = True
            continue
        if id(param) in vocab_weights:  # split by vocabulary (or whole, summed over the rows' axes)
            entry = LayerParam("vocab", param.shape[0], param.shape[1], region="rows", name=param_name)
        else:  # inside the base model: the x*y group's rows, like the layers; outside it: this rank's own rows
            rows = param.shape[0] if param.dim() else 1
            region = "layer" if id(param) in in_stack else None
            entry = LayerParam("replicated", rows, param.numel() // rows, region=region, name=param_name)
        (after if passed else before).append(entry)
    try:
        refuse_other_lookups(stack, plan, stack_name)
    except ShardingError as error:
        refusals.append((("x", "y"), str(error)))
    refusal = plan.adapter.refusal(config) if plan.adapter is not None else None
    if refusal:  # the family's own (engine/models/families/), on every tensor-parallel axis
        refusals.append((("x", "y", "z"), refusal))
    hidden = embedding.embedding_dim
    intermediate = getattr(config, "intermediate_size", None)  # the activation estimate's MLP width
    intermediate = intermediate if isinstance(intermediate, int) and intermediate > 0 else 4 * hidden
    return TransformerShape(
        hidden=hidden,
        layers=len(layers),
        heads=heads,
        kv_heads=kv_heads,
        intermediate=intermediate,
        vocab=embedding.num_embeddings,
        head_dim=head_dim,
        tie_embeddings=head is not None and head.weight is embedding.weight,
        name=name or family,
        gated_mlp=any(p.fused == "halves" or "gate" in p.path for p in plan.projections),
        layer_layout=tuple(layout),
        before_layers=tuple(before),
        after_layers=tuple(after),
        fused_blocks=tuple(fused_blocks),
        refusals=tuple(refusals),
        # any grid whose x*y*z divides the vocabulary leaves only the model's own reasons
        vocab_refusal=can_shard_vocab(model, GridShape(x=embedding.num_embeddings)) or "",
        logits_loss=_takes_logits(model.config),
        pipeline_refusal=_pipeline_refusal(model),
    )


def _pipeline_refusal(model: nn.Module) -> str:
    """Why the engine's pipeline cannot cut `model` into stages (its own check), or "" when it can."""
    try:
        check_model(model)
    except ValueError as error:
        return str(error)
    return ""
