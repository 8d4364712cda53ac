"""The training loop: schedule, accumulation equivalence, exact resume, atomic checkpoints, config validation."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from engine.training.checkpoint import read_trainer_state
from engine.training.train import StepLoss, TrainConfig, TrainingStopped, lr_factor, train


def _model(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
    )
    return LlamaForCausalLM(config)


def _examples(n: int = 8, length: int = 16):
    generator = torch.Generator().manual_seed(1)
    examples = []
    for _ in range(n):
        ids = torch.randint(0, 64, (length,), generator=generator)
        examples.append({"input_ids": ids, "targets": torch.cat([ids[1:], torch.tensor([-100])])})
    return examples


def _loss(model, batch) -> StepLoss:
    logits = model(input_ids=batch["input_ids"]).logits
    flat = F.cross_entropy(logits.flatten(0, 1).float(), batch["targets"].flatten(), reduction="sum")
    n = int((batch["targets"] != -100).sum())
    return StepLoss(loss_sum=flat, n_tokens=n, extras={"twice": (2 * float(flat.detach()), n)})


def _save(model, directory, step):
    model.save_pretrained(directory)


def test_lr_schedule_warmup_and_cosine():
    config = TrainConfig(lr=1.0, warmup_steps=4, schedule="cosine", min_lr_ratio=0.1)
    assert [lr_factor(s, 20, config) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_factor(4, 20, config) == pytest.approx(1.0)
    assert lr_factor(20, 20, config) == pytest.approx(0.1)
    middle = 4 + 8
    assert lr_factor(middle, 20, config) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))


def test_grad_accumulation_matches_full_batch():
    # The loop normalises by the token count of the whole step, so 4 micro-batches of 2 equal 1 batch of 8 up to
    # float32 summation order (observed differences ~1e-7; 1e-5 leaves room for other BLAS). SGD, because its
    # update is lr x gradient: the weights then differ by lr x the gradients' rounding differences, ~1e-7 of an
    # update, where AdamW would move a weight with a near-zero gradient by a CPU-dependent fraction of lr.
    full, accum = _model(), _model()
    examples = _examples()
    config = dict(epochs=2, batch_size=8, optimizer="sgd", lr=0.5, max_grad_norm=None, progress=False)
    r1 = train(full, examples, _loss, TrainConfig(**config))
    r2 = train(accum, examples, _loss, TrainConfig(**config, grad_accum=4))
    assert [h["loss"] for h in r1.history] == pytest.approx([h["loss"] for h in r2.history], rel=1e-5)
    moved = max((a - b).abs().max().item() for a, b in zip(full.parameters(), _model().parameters()))
    assert moved > 1e-2  # the steps moved the weights: the comparison below can fail
    for a, b in zip(full.parameters(), accum.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert r1.history[0]["twice"] == pytest.approx(2 * r1.history[0]["loss"], rel=1e-6)


class _Crash(Exception):
    pass


def test_resume_continues_bit_exactly(tmp_path):
    examples = _examples()
    config = TrainConfig(
        epochs=3, batch_size=4, lr=5e-3, warmup_steps=2, schedule="cosine", save_every=2, progress=False
    )
    whole = train(_model(), examples, _loss, config, out_dir=tmp_path / "whole", save_model=_save)
    losses = [h["loss"] for h in whole.history]
    assert len(losses) == 6

    def crash_at_step_3(record):
        if record["step"] == 3:
            raise _Crash  # the step-2 checkpoint exists; step 3 was never saved

    run = tmp_path / "run"
    with pytest.raises(_Crash):
        train(_model(), examples, _loss, config, out_dir=run, save_model=_save, on_log=crash_at_step_3)
    assert read_trainer_state(run / "checkpoint")["step"] == 2

    model = _model(seed=123)  # different init: every weight must come from the checkpoint
    from goldfish.app.model_files import load_model_weights

    load_model_weights(model, run / "checkpoint")
    resumed = train(model, examples, _loss, config, out_dir=run, resume_from=run / "checkpoint", save_model=_save)
    # Bit-exact: same weights, optimizer state, schedule and data order.
    assert [h["step"] for h in resumed.history] == [3, 4, 5, 6]
    assert [h["loss"] for h in resumed.history] == losses[2:]
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5, 6]
    assert [m["loss"] for m in metrics] == losses


def test_a_stop_request_checkpoints_the_step_done_and_the_resume_continues_bit_exactly(tmp_path):
    """train(stop=...): asked after every step; a True writes the checkpoint of the steps done (no --save-every
    needed) and raises TrainingStopped naming it, from which a resume continues as if never stopped."""
    examples = _examples()
    config = TrainConfig(epochs=3, batch_size=4, lr=5e-3, warmup_steps=2, schedule="cosine", progress=False)
    losses = [h["loss"] for h in train(_model(), examples, _loss, config).history]
    asked = []

    def stop() -> bool:  # what a Ctrl-C during step 3 sets
        asked.append(True)
        return len(asked) >= 3

    run = tmp_path / "run"
    with pytest.raises(TrainingStopped) as stopped:
        train(_model(), examples, _loss, config, out_dir=run, save_model=_save, stop=stop)
    assert (stopped.value.step, stopped.value.total_steps, stopped.value.checkpoint) == (3, 6, run / "checkpoint")
    assert isinstance(stopped.value, KeyboardInterrupt)  # cleanup written for Ctrl-C runs for it too
    assert read_trainer_state(run / "checkpoint")["step"] == 3
    model = _model(seed=123)
    from goldfish.app.model_files import load_model_weights

    load_model_weights(model, run / "checkpoint")
    resumed = train(model, examples, _loss, config, out_dir=run, resume_from=run / "checkpoint", save_model=_save)
    assert [h["loss"] for h in resumed.history] == losses[3:]
    # asked after every step but the last: a request during the last step lets the run finish as it would
    finished = train(_model(), examples, _loss, config, stop=lambda: False)
    assert len(finished.history) == 6


def test_resume_refuses_changed_settings(tmp_path):
    examples = _examples()
    config = TrainConfig(epochs=1, batch_size=4, progress=False)
    train(_model(), examples, _loss, config, out_dir=tmp_path, save_model=_save)
    changed = TrainConfig(epochs=1, batch_size=4, lr=1e-2, progress=False)
    with pytest.raises(ValueError, match="lr"):
        train(
            _model(), examples, _loss, changed, out_dir=tmp_path, resume_from=tmp_path / "checkpoint", save_model=_save
        )
    with pytest.raises(FileNotFoundError, match="trainer_state"):
        train(_model(), examples, _loss, config, resume_from=tmp_path / "nowhere")


def test_checkpoint_is_atomic_and_hf_loadable(tmp_path):
    model = _model()
    train(
        model,
        _examples(),
        _loss,
        TrainConfig(epochs=1, batch_size=4, progress=False),
        out_dir=tmp_path,
        save_model=_save,
    )
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["checkpoint", "metrics.jsonl"]  # no staging or .old folders left behind
    loaded = LlamaForCausalLM.from_pretrained(tmp_path / "checkpoint")
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(epochs=0), "epochs"),
        (dict(batch_size=6, grad_accum=4), "divisible"),
        (dict(lr=0.0), "lr"),
        (dict(schedule="linear"), "schedule"),
        (dict(precision="fp16"), "precision"),
        (dict(max_grad_norm=-1.0), "max_grad_norm"),
    ],
)
def test_config_validation(bad, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**bad)


def test_bf16_autocast_trains():
    model = _model()
    result = train(
        model, _examples(), _loss, TrainConfig(epochs=3, batch_size=8, lr=1e-2, precision="bf16", progress=False)
    )
    assert result.history[-1]["loss"] < result.history[0]["loss"]
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_on_epoch_end_sees_each_finished_epoch_in_eval_mode(tmp_path):
    # 6 examples, batch 4 -> 2 steps per epoch; the hook must fire after steps 2, 4, 6 with epochs 1, 2, 3.
    model = _model()
    calls = []

    def on_epoch_end(m, epoch, step):
        calls.append((epoch, step, m.training, torch.is_grad_enabled()))

    result = train(
        model, _examples(n=6), _loss, TrainConfig(epochs=3, batch_size=4, progress=False), on_epoch_end=on_epoch_end
    )
    assert calls == [(1, 2, False, False), (2, 4, False, False), (3, 6, False, False)]
    assert model.training  # training mode restored after the hook
    assert len(result.history) == 6
