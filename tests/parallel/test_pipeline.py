"""The pipeline (engine/training/pipeline.py) against one process: stages, every schedule, and the one-line errors.

In-process: the stages of Llama, Qwen2 and GPT-2, run one after the other, give the model's logits bit for bit
(same operations on the same shapes), and the cuts balance parameter counts.

On gloo at world 2 and 4, each rank builds the same float64 model, cuts it into P * V stages and runs one step of
B = 8 sequences in M micro-batches under each schedule (GPipe, 1F1B, interleaved 1F1B and zero bubble with V = 2);
then an SGD step. The summed loss, every parameter's gradient (each from the rank holding it) and the updated
weights equal one process's on the whole batch, and each rank's sent bytes equal the activation model.
Tolerance: float64 with eps 1.1e-16; the pipeline runs the same operations, only on B/M rows at a time, so a weight
gradient is a sum of M partial sums instead of one sum over B*T = 64 rows: the reordering bounds the difference by
about 64 * eps * (sum of |terms|) ~ 1e-14 relative, and 1e-10 leaves room without hiding a missing or doubled
micro-batch (an error of order 1).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from distributed import run_distributed
from tiny_models import tiny_gpt2, tiny_llama

from engine.core.grid import init
from engine.training.pipeline import Pipeline, balanced_splits, check_schedule, split_model

VOCAB, SEQ, ROWS, LR, LAYERS = 64, 8, 8, 0.1, 8  # 8 layers: 4 ranks x 2 virtual stages
TOLERANCE = {"rtol": 1e-10, "atol": 1e-10}  # float64, see the module docstring


def llama() -> torch.nn.Module:
    return tiny_llama(vocab=VOCAB, hidden=32, heads=4, kv_heads=2, layers=LAYERS, positions=32, dtype=torch.float64)


def qwen2() -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).to(torch.float64)


def gpt2() -> torch.nn.Module:
    model = tiny_gpt2(vocab=VOCAB, hidden=32, layers=LAYERS, dtype=torch.float64)
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())  # untied: see pipeline.py
    model.config.tie_word_embeddings = False
    return model


MODELS = {"llama": llama, "qwen2": qwen2, "gpt2": gpt2}


def loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum")


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (ROWS, SEQ), generator=generator)
    return ids, torch.cat([ids[:, 1:], torch.full((ROWS, 1), -100)], dim=1)


def serial(name: str) -> dict:
    model = MODELS[name]()
    ids, labels = batch()
    loss = loss_sum(model(input_ids=ids).logits, labels)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    torch.optim.SGD(model.parameters(), lr=LR).step()
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    return {"loss": loss.item(), "grads": grads, "weights": weights}


# ----- in process ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(MODELS))
def test_stages_in_sequence_give_the_models_logits(name: str) -> None:
    model = MODELS[name]()
    ids, _ = batch()
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        for n_stages, splits in ((2, None), (3, None), (8, None), (3, [1, 6])):
            h = ids
            for stage in split_model(model, n_stages, splits):
                h = stage(h)
            assert torch.equal(h, expected), (name, n_stages, splits)


def test_cuts_balance_parameter_counts() -> None:
    assert balanced_splits([1] * 8, 2) == [4]
    assert balanced_splits([1] * 8, 3) == [3, 5]
    assert balanced_splits([1] * 4, 4) == [1, 2, 3]
    assert balanced_splits([6, 1, 1, 1, 1, 1, 1], 2) == [1]  # a heavy first layer stands alone
    assert balanced_splits([1, 1, 1, 1, 5], 3) == [3, 4]  # shares of 3: the heavy last layer alone
    stages = split_model(llama(), 2)
    assert [(s.start, s.stop) for s in stages] == [(0, 4), (4, 8)]
    assert stages[0].embed is not None and stages[0].lm_head is None and stages[1].lm_head is not None


def test_impossible_settings_are_refused_in_one_line() -> None:
    cases = [
        (lambda: split_model(llama(), 9), "9 stages for 8 decoder layers"),
        (lambda: split_model(llama(), 2, [0]), "increasing layer indices"),
        (lambda: split_model(llama(), 3, [2]), "give 2 increasing"),
        (lambda: split_model(tiny_llama(vocab=VOCAB, hidden=32, heads=4, tied=True), 2), "untie them"),
        (lambda: split_model(tiny_gpt2(vocab=VOCAB, hidden=32), 2), "untie them"),
        (lambda: check_schedule("1f1b", 4, 1, 3), r"as many micro-batches as pipeline ranks \(4\), not 3"),
        (lambda: check_schedule("gpipe", 2, 2, 4), "one stage per rank"),
        (lambda: check_schedule("interleaved-1f1b", 4, 2, 9), "in 2 rounds"),
        (lambda: check_schedule("dualpipe", 2, 1, 4), "unknown pipeline schedule"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message) as caught:
            call()
        assert "\n" not in str(caught.value)
    for schedule, ranks, virtual, m in (("gpipe", 4, 1, 1), ("1f1b", 4, 1, 4), ("interleaved-1f1b", 4, 2, 3)):
        check_schedule(schedule, ranks, virtual, m)  # possible settings pass


def test_unconfirmed_families_are_refused() -> None:
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4
    )
    with pytest.raises(ValueError, match="confirmed for llama, qwen2, gpt2 only"):
        split_model(MistralForCausalLM(config), 2)


# ----- on gloo ------------------------------------------------------------------------------------------------

# (model, schedule, V, M) run at each world size
CASES = [
    ("llama", "gpipe", 1, 4),
    ("llama", "1f1b", 1, 4),
    ("gpt2", "1f1b", 1, 8),
    ("qwen2", "gpipe", 1, 2),
    ("llama", "interleaved-1f1b", 2, 4),
    ("llama", "zero-bubble", 2, 4),
]


def _worker(cases: list[tuple[str, str, int, int]]) -> list[dict]:
    grid = init(data=torch.distributed.get_world_size())
    group = grid.group("data")
    out = []
    for name, schedule, virtual, m in cases:
        model = MODELS[name]()
        pipe = Pipeline(model, group, loss_fn=loss_sum, schedule=schedule, microbatches=m, virtual=virtual)
        ids, labels = batch()
        if m > 1:  # a batch M does not divide: refused on every rank before any message
            with pytest.raises(ValueError, match="does not split into"):
                pipe.step(ids[:-1], labels[:-1])
        loss = pipe.step(ids, labels)
        params = pipe.named_parameters()
        grads = {n: p.grad.numpy().copy() for n, p in params.items()}  # numpy: tensors would travel as shared memory
        torch.optim.SGD(pipe.parameters(), lr=LR).step()
        weights = {n: p.detach().numpy().copy() for n, p in params.items()}
        out.append({"loss": loss.item(), "grads": grads, "weights": weights, "sent": pipe.stats.sent_bytes})
    grid.close()
    return out


def _check(world: int, cases: list[tuple[str, str, int, int]]) -> None:
    results = run_distributed(world, _worker, cases)
    references = {name: serial(name) for name in {c[0] for c in cases}}
    for i, (name, schedule, virtual, m) in enumerate(cases):
        ref, where = references[name], f"{name} {schedule} P={world} V={virtual} M={m}"
        for rank in range(world):  # every rank reports the summed loss
            assert results[rank][i]["loss"] == pytest.approx(ref["loss"], rel=1e-12), where
            # it sent the float64 hidden states (ROWS/M, SEQ, 32) of each micro-batch forward from each of its stages
            # but the last and their gradient back from each but the first (the refused batch sent nothing)
            stages = [rank + world * v for v in range(virtual)]
            crossings = sum(s != world * virtual - 1 for s in stages) + sum(s != 0 for s in stages)
            assert results[rank][i]["sent"] == crossings * ROWS * SEQ * 32 * 8, where
        for key in ("grads", "weights"):
            merged = {}
            for rank in range(world):
                assert not set(merged) & set(results[rank][i][key]), f"{where}: a parameter on two ranks"
                merged.update({n: torch.from_numpy(a) for n, a in results[rank][i][key].items()})
            assert set(merged) == set(ref[key]), where
            for n, expected in ref[key].items():
                torch.testing.assert_close(merged[n], expected, **TOLERANCE, msg=f"{where}: {key} {n}")


def test_every_schedule_equals_one_process_at_world_2() -> None:
    _check(2, CASES)


def test_every_schedule_equals_one_process_at_world_4() -> None:
    _check(4, CASES)
