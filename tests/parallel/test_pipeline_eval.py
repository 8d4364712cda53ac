"""Evaluation through pipeline stages (engine/training/pipeline_eval.py) against the serial model, on gloo at pipe=2.

Each rank builds the same float32 model (Llama, and GPT-2 with its lm_head untied), keeps only its own stage and
runs eval/'s unchanged functions on it: a teacher-forced pass over left-padded rows (padding mask and explicit
positions), a right-padded pass without positions (eval.logprobs' call), greedy decoding with a KV cache per stage
(eval.decoding.greedy_paths), extraction's shared pass (forced_greedy), beam search and seeded sampling (HF
generate, eval.adaptive), and the gradient-norm attack's backward through the stages (eval.membership.gradient_norm
on the serial model). Every rank gets the serial model's logits, ids, beams, samples and norms.

Tolerance: none for the ids and the logits (GRAD_NORM_RTOL for the gradient norms). Each stage runs the serial
forward's operations on the same shapes, in the same order, on one CPU: the numbers are the same floats. The serial
reference decodes with the plain model's own set-up (eval.decoding's preallocated cache) but without oneDNN linears
(ONEDNN_LINEARS off in these processes: oneDNN sums the same products in another order, a float32 rounding
difference, which a pipelined model never takes).
"""

from __future__ import annotations

from typing import Callable

import pytest
import torch
from distributed import run_distributed, worker_threads
from tiny_models import tiny_gpt2, tiny_llama

VOCAB, PAD = 48, 0
# The gradient norm: the backward crosses the stage boundary as a gradient handed over whole, where the serial
# backward may add the boundary activation's two uses (residual and the next layer) in another order: one float32
# rounding (6e-8 relative) per element of that gradient, carried into the earlier stage's gradients. 1e-6 relative
# on the norm covers it (1 ulp of float64 observed) and still fails on a missing stage (half the squares).
GRAD_NORM_RTOL = 1e-6


def llama() -> torch.nn.Module:
    return tiny_llama(vocab=VOCAB, hidden=32, heads=4, kv_heads=2, layers=4, positions=64)


def gpt2() -> torch.nn.Module:
    model = tiny_gpt2(vocab=VOCAB, hidden=32, layers=4, positions=64)
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())  # untied: see pipeline.py
    model.config.tie_word_embeddings = False
    return model


MODELS = {"llama": llama, "gpt2": gpt2}


def rows() -> list[list[int]]:
    """Prompts of different lengths, so that left padding pads some rows."""
    generator = torch.Generator().manual_seed(5)
    return [torch.randint(1, VOCAB, (n,), generator=generator).tolist() for n in (12, 7, 12, 3, 9)]


def measure(model: torch.nn.Module, gradient_norm: Callable[[list[int]], float]) -> dict:
    """What the tests compare, from `model` as eval/ calls it (the serial model or the pipelined one), and the
    gradient-norm attack's norm of each prompt."""
    import eval.decoding as decoding
    from eval.adaptive import SamplingConfig, beam_search_decode, sample_decode
    from eval.batching import left_pad, pad_batch

    decoding.ONEDNN_LINEARS = False  # see the module docstring
    prompts = rows()
    with torch.no_grad():
        ids, mask, positions = left_pad(prompts, PAD, torch.device("cpu"))
        left = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        ids, mask = pad_batch(prompts, PAD, side="right")
        right = model(input_ids=ids, attention_mask=mask).logits
    paths = decoding.greedy_paths(model, prompts, 6, pad_token_id=PAD, batch_size=3)
    beams = beam_search_decode(model, prompts, 5, num_beams=3, pad_token_id=PAD, batch_size=3)
    sampling = SamplingConfig(temperature=1.0, top_p=0.9, n_samples=3, seed=7)
    samples = [sample_decode(model, prompt, 5, sampling, pad_token_id=PAD) for prompt in prompts[:2]]
    docs = [p + q for p, q in zip(prompts, reversed(prompts))]
    forced, predicted = decoding.forced_greedy(
        model, docs, [len(p) for p in prompts], 3, pad_token_id=PAD, device=torch.device("cpu")
    )
    return {
        "left": left.numpy().copy(),  # numpy: tensors would travel as shared memory
        "right": right.numpy().copy(),
        "greedy": [(p.ids, p.min_margin, p.logprob_mean) for p in paths],
        "forced": [(p.ids, p.min_margin, p.logprob_mean, p.reference_logprob_mean) for p in forced],
        "predicted": [p.tolist() for p in predicted],
        "beams": beams,
        "samples": samples,
        "grad_norm": [gradient_norm(p) for p in prompts],
    }


def _worker(name: str) -> dict:
    from engine.core.grid import init
    from engine.training.pipeline_eval import PipelineEvalModel

    grid = init(pipe=2)
    model = MODELS[name]()
    total = sum(p.numel() for p in model.parameters())
    runner = PipelineEvalModel(model, grid.group("pipe"))
    held = sum(p.numel() for p in runner.parameters())
    stage = sum(p.numel() for p in runner.all_stages[grid.rank].parameters())
    result = measure(runner, runner.gradient_norm)
    grid.close()
    return {**result, "held": held, "stage": stage, "total": total}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_pipelined_model_evaluates_as_the_serial_model(name: str) -> None:
    """Every rank of pipe=2 gets the serial model's logits, greedy ids, margins, log-probabilities, beams, samples
    and gradient norms, while holding only its own stage's parameters (about half of the model's)."""
    from eval.membership import gradient_norm

    serial = MODELS[name]()
    with worker_threads():  # bit for bit: the ranks' thread count
        expected = measure(serial, lambda ids: gradient_norm(serial, ids))
    results = run_distributed(2, _worker, name)
    assert sum(got["held"] for got in results) == results[0]["total"]
    for rank, got in enumerate(results):
        assert got["held"] == got["stage"] and 0.3 < got["held"] / got["total"] < 0.7, (rank, got["held"])
        for key in ("left", "right"):
            assert (got[key] == expected[key]).all(), (rank, key, abs(got[key] - expected[key]).max())
        for key in ("greedy", "forced", "predicted", "beams", "samples"):
            assert got[key] == expected[key], (rank, key)
        assert got["grad_norm"] == pytest.approx(expected["grad_norm"], rel=GRAD_NORM_RTOL, abs=0), rank


def _loading_worker(folder: str) -> dict:
    from weight_reads import logged_weight_reads

    import goldfish.app.models as models
    from engine.core.grid import init

    grid = init(pipe=2)
    with logged_weight_reads() as read:
        runner = models.load_parallel_model(folder, grid)
    ids, mask, positions = _left_padded()
    with torch.no_grad():
        logits = runner(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    stage = sorted(runner.stage.names.values())
    grid.close()
    return {"read": read, "stage": stage, "logits": logits.numpy().copy(), "training": runner.training}


def _left_padded() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from eval.batching import left_pad

    return left_pad(rows(), PAD, torch.device("cpu"))


def test_each_stage_reads_only_its_own_tensors_from_a_checkpoint(tmp_path) -> None:
    """goldfish.app.models.load_parallel_model on pipe=2 from a saved folder: each rank reads exactly its own
    stage's tensors from the safetensors file (each once), the stages together read the whole model, and the
    logits equal those of the model load_pretrained_model loads (bit for bit, as above)."""
    from goldfish.app.pretrained import load_pretrained_model

    llama().save_pretrained(tmp_path)
    serial = load_pretrained_model(tmp_path)
    ids, mask, positions = _left_padded()
    with torch.no_grad():
        expected = serial(input_ids=ids, attention_mask=mask, position_ids=positions).logits.numpy()
    results = run_distributed(2, _loading_worker, str(tmp_path))
    assert sorted(name for got in results for name in got["read"]) == sorted(dict(serial.named_parameters()))
    for rank, got in enumerate(results):
        assert sorted(got["read"]) == got["stage"], rank
        assert (got["logits"] == expected).all() and not got["training"], rank
