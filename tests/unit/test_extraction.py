"""Batched greedy decoding against batch-size-1 decoding and HF generate; extract() end to end."""

import contextlib
import json
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from transformers import (
    GenerationConfig,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

import eval.decoding
from eval.decoding import greedy_decode, greedy_paths
from eval.extraction import ExtractionConfig, extract, write_extraction
from eval.intervals import mean_interval
from eval.logprobs import token_log_probs

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 256
# initializer_range 0.2 (not HF's default 0.02): the default init gives near-flat logits, so greedy output
# degenerates into repeating one token and a wrong position/padding treatment can go unnoticed.
INIT = 0.2


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=INIT,
        bos_token_id=1,
        eos_token_id=2,
    )
    return LlamaForCausalLM(cfg).eval()


def tiny_gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=VOCAB,
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_positions=512,
        initializer_range=INIT,
        bos_token_id=1,
        eos_token_id=2,
    )
    return GPT2LMHeadModel(cfg).eval()


def tiny_qwen2_hybrid() -> Qwen2ForCausalLM:
    """One full-attention layer and one sliding-window layer (window 6, shorter than most prompts): transformers
    builds a sliding-window cache layer for the second, which decoding keeps as it is."""
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=INIT,
        use_sliding_window=True,
        sliding_window=6,
        layer_types=["full_attention", "sliding_attention"],
    )
    return Qwen2ForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def llama() -> LlamaForCausalLM:
    return tiny_llama()


def random_ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def hf_generate(model, prefix: list[int], n: int) -> list[int]:
    """Reference: HF generate at batch size 1, greedy, no EOS stop (we always emit n ids)."""
    gc = GenerationConfig(do_sample=False, max_new_tokens=n, eos_token_id=None, pad_token_id=0)
    ids = torch.tensor([prefix])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gc)
    return out[0, len(prefix) :].tolist()


def onednn_calls(monkeypatch, onednn: bool) -> list[bool]:
    """Set eval.decoding.ONEDNN_LINEARS to `onednn`, send every linear layer to oneDNN when on (the tiny models'
    matmuls are below ONEDNN_MIN_MACS), and return a list that collects each `_onednn_fits` answer."""
    if onednn and not torch.backends.mkldnn.is_available():
        pytest.skip("torch is built without oneDNN")
    monkeypatch.setattr(eval.decoding, "ONEDNN_LINEARS", onednn)
    monkeypatch.setattr(eval.decoding, "ONEDNN_MIN_MACS", 0)
    answers: list[bool] = []
    fits = eval.decoding._onednn_fits

    def spy(*args):
        answers.append(fits(*args))
        return answers[-1]

    monkeypatch.setattr(eval.decoding, "_onednn_fits", spy)
    return answers


@pytest.mark.parametrize("onednn", [True, False], ids=["onednn", "torch-gemm"])
@pytest.mark.parametrize(
    "make_model", [tiny_llama, tiny_gpt2, tiny_qwen2_hybrid], ids=["llama", "gpt2", "qwen2-sliding-window"]
)
def test_batched_equals_single_equals_hf_generate(make_model, onednn, monkeypatch):
    """On oneDNN (nn.Linear through F.linear; GPT-2's Conv1D through torch.addmm) and on torch's GEMM, with the
    preallocated cache layers and a sliding-window layer kept as transformers builds it."""
    model = make_model()
    onednn_answers = onednn_calls(monkeypatch, onednn)
    lengths = [5, 17, 1, 30, 12, 3, 17]
    prefixes = [random_ids(n, seed) for seed, n in enumerate(lengths)]
    n_new = 24
    single = [greedy_decode(model, [p], n_new, pad_token_id=0, batch_size=1)[0] for p in prefixes]
    reference = [hf_generate(model, p, n_new) for p in prefixes]
    # Exact equality is the contract. In fp32 the padded and unpadded runs differ by rounding only
    # (~1e-6 relative), far below the top-2 logit gaps of this init, so argmax cannot flip.
    assert single == reference
    for batch_size in (3, 7):  # mixed lengths in one batch, and a ragged last batch
        for pad in (0, VOCAB - 1):  # the pad id must not matter: padded slots are masked out
            assert greedy_decode(model, prefixes, n_new, pad_token_id=pad, batch_size=batch_size) == reference
    # Guard against a degenerate model that would make the comparison vacuous.
    assert len({t for ids in reference for t in ids}) > 30
    assert len({tuple(ids) for ids in reference}) == len(set(map(tuple, prefixes)))
    # Every linear layer went to oneDNN when on (HF generate runs outside its context), none when off.
    assert onednn_answers and all(onednn_answers) if onednn else not onednn_answers


def test_onednn_linears_equal_torch_and_leave_what_does_not_fit(monkeypatch):
    """F.linear and GPT-2's torch.addmm(bias, x, weight (in, out)) on oneDNN equal torch's up to float32 rounding;
    calls that do not fit (float64, a 1-D input, a 2-D addmm input, autograd, fewer multiply-adds than
    ONEDNN_MIN_MACS) and every other function run unchanged, bit for bit. The routing is entered only for a forward
    of enough tokens, on a plain HF model on the CPU, with ONEDNN_LINEARS set."""
    if not torch.backends.mkldnn.is_available():
        pytest.skip("torch is built without oneDNN")
    monkeypatch.setattr(eval.decoding, "ONEDNN_MIN_MACS", 5 * 64 * 96)  # the addmm's count below: it just fits
    gen = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(shape, generator=gen) for shape in ((3, 5, 64), (96, 64), (96,)))
    fits: list[bool] = []
    with monkeypatch.context() as patch:
        original = eval.decoding._onednn_fits
        patch.setattr(eval.decoding, "_onednn_fits", lambda *a: fits.append(original(*a)) or fits[-1])
        with torch.no_grad(), eval.decoding._OneDNNLinears():
            linear, addmm = F.linear(x, w, b), torch.addmm(b, x[0], w.t())
            plain = torch.matmul(x, w.t())
            small = F.linear(x[0, :4], w)  # 4 x 64 x 96 multiply-adds: below ONEDNN_MIN_MACS
    assert fits == [True, True, False]
    assert linear == pytest.approx(F.linear(x, w, b), abs=1e-4)
    assert addmm == pytest.approx(torch.addmm(b, x[0], w.t()), abs=1e-4)
    assert torch.equal(plain, torch.matmul(x, w.t())) and torch.equal(small, F.linear(x[0, :4], w))

    monkeypatch.setattr(eval.decoding, "ONEDNN_MIN_MACS", 0)
    wg = w.clone().requires_grad_()
    with eval.decoding._OneDNNLinears():
        unfit = [
            F.linear(x.double(), w.double()),
            F.linear(x[0, 0], w),
            torch.addmm(b.expand(5, 96), x[0], w.t()),
            F.linear(x, wg),
        ]
    assert torch.equal(unfit[0], F.linear(x.double(), w.double())) and torch.equal(unfit[1], F.linear(x[0, 0], w))
    assert torch.equal(unfit[2], torch.addmm(b.expand(5, 96), x[0], w.t()))
    assert unfit[3].requires_grad and torch.equal(unfit[3], F.linear(x, wg))

    # The tiny Llama's largest weight is its 256 x 64 embedding: two tokens reach 30,720 multiply-adds, one does not.
    monkeypatch.setattr(eval.decoding, "ONEDNN_MIN_MACS", 30_720)
    monkeypatch.setattr(eval.decoding, "ONEDNN_LINEARS", True)
    llama, cpu = tiny_llama(), torch.device("cpu")
    assert isinstance(eval.decoding.onednn_linears(llama, cpu)(2), eval.decoding._OneDNNLinears)
    assert isinstance(eval.decoding.onednn_linears(llama, cpu)(1), contextlib.nullcontext)
    # Off where it does not apply: another device, a wrapper (the engine's parallel models), the setting off.
    assert isinstance(eval.decoding.onednn_linears(llama, torch.device("meta"))(100), contextlib.nullcontext)
    assert isinstance(eval.decoding.onednn_linears(CountingWrapper(llama), cpu)(100), contextlib.nullcontext)
    monkeypatch.setattr(eval.decoding, "ONEDNN_LINEARS", False)
    assert isinstance(eval.decoding.onednn_linears(llama, cpu)(100), contextlib.nullcontext)


def test_preallocated_cache_writes_in_place_and_attends_over_the_filled_columns(llama):
    """A plain HF model's cache layers are views of buffers allocated once: each update writes its columns in place
    and returns the filled columns only; a sliding-window layer and a wrapped model's cache are transformers' own."""
    cache = eval.decoding._new_cache(llama, 6)
    assert [type(layer) for layer in cache.layers] == [eval.decoding._PreallocatedLayer] * 2
    layer = cache.layers[0]
    k1, v1, k2, v2 = (torch.randn(2, 3, n, 4) for n in (4, 4, 2, 2))
    keys, values = layer.update(k1, v1)
    assert torch.equal(keys, k1) and torch.equal(values, v1) and layer.get_seq_length() == 4
    buffer = keys.data_ptr()
    keys, values = layer.update(k2, v2)
    assert torch.equal(keys, torch.cat([k1, k2], dim=2)) and torch.equal(values, torch.cat([v1, v2], dim=2))
    assert keys.data_ptr() == buffer and layer.get_seq_length() == 6 and layer.get_mask_sizes(1) == (7, 0)
    with pytest.raises(RuntimeError, match="6 columns cannot take 7"):
        layer.update(k2[:, :, :1], v2[:, :, :1])
    hybrid = eval.decoding._new_cache(tiny_qwen2_hybrid(), 6)
    assert [type(layer).__name__ for layer in hybrid.layers] == ["_PreallocatedLayer", "DynamicSlidingWindowLayer"]
    assert eval.decoding._new_cache(CountingWrapper(llama), 6) is None


def test_near_tie_record_matches_a_teacher_forced_pass(llama):
    """Each greedy path's smallest top-1 vs top-2 margin and its position, against one uncached forward pass
    over prefix + generated ids (batch 1); the record does not depend on the batch size."""
    prefixes = [random_ids(n, 50 + n) for n in (4, 11, 7, 20, 2)]
    n_new = 12
    batched = greedy_paths(llama, prefixes, n_new, pad_token_id=0, batch_size=3)
    assert [p.ids for p in batched] == greedy_decode(llama, prefixes, n_new, pad_token_id=0)
    for prefix, path, single in zip(
        prefixes, batched, greedy_paths(llama, prefixes, n_new, pad_token_id=0, batch_size=1)
    ):
        with torch.no_grad():
            logits = llama(torch.tensor([prefix + path.ids])).logits[0]  # (P + n_new, V)
        steps = logits[len(prefix) - 1 : len(prefix) - 1 + n_new]  # the logits each generated id came from
        assert steps.argmax(-1).tolist() == path.ids
        top2 = steps.topk(2, dim=-1).values
        margins = top2[:, 0] - top2[:, 1]
        assert path.min_margin == pytest.approx(float(margins.min()), abs=1e-4)
        assert path.min_margin_position == int(margins.argmin()) and 0 <= path.min_margin_position < n_new
        assert single.min_margin == pytest.approx(path.min_margin, abs=1e-4)
        assert single.min_margin_position == path.min_margin_position


def test_greedy_decode_contract(llama):
    llama.train()
    out = greedy_decode(llama, [[3, 4], [5]], 7, pad_token_id=0)
    assert [len(x) for x in out] == [7, 7]
    assert llama.training  # mode restored
    llama.eval()
    with pytest.raises(ValueError, match="empty"):
        greedy_decode(llama, [[1], []], 3, pad_token_id=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        greedy_decode(llama, [[1]], 0, pad_token_id=0)
    with pytest.raises(ValueError, match="batch_size"):
        greedy_decode(llama, [[1]], 2, pad_token_id=0, batch_size=0)


def test_early_eos_is_just_another_id(llama):
    prefix = random_ids(8, 99)
    ours = greedy_decode(llama, [prefix], 20, pad_token_id=0)[0]
    eos = ours[3]  # pretend the 4th generated id is EOS: HF generate would stop there
    gc = GenerationConfig(do_sample=False, max_new_tokens=20, eos_token_id=eos, pad_token_id=0)
    stopped = llama.generate(torch.tensor([prefix]), generation_config=gc)[0, len(prefix) :].tolist()
    assert stopped[: ours.index(eos) + 1] == ours[: ours.index(eos) + 1]
    assert len(ours) == 20  # we keep going; exact match then fails on the rest unless it is right


def test_config_validation_and_split():
    for bad in ({"suffix_len": 0}, {"batch_size": -1}, {"prefix_len": 0}, {"suffix_len": 2.5}, {"suffix_len": True}):
        with pytest.raises(ValueError, match="ExtractionConfig"):
            ExtractionConfig(**bad)
    doc = list(range(10))
    goldfish = ExtractionConfig(suffix_len=4)
    assert goldfish.split(doc) == ([0, 1, 2, 3, 4, 5], [6, 7, 8, 9])
    assert goldfish.split(doc[:5]) == ([0], [1, 2, 3, 4]) and goldfish.split(doc[:4]) is None
    pythia = ExtractionConfig(suffix_len=3, prefix_len=4)
    assert pythia.split(doc) == ([0, 1, 2, 3], [4, 5, 6])
    assert pythia.split(doc[:7]) == ([0, 1, 2, 3], [4, 5, 6]) and pythia.split(doc[:6]) is None


@dataclass
class Doc:
    id: str
    token_ids: list[int]


def decode(ids: list[int]) -> str:
    return " ".join(f"w{i}" for i in ids)


def make_docs(model, config: ExtractionConfig) -> tuple[list[Doc], set[str]]:
    """Documents whose suffix is the model's own greedy continuation (memorized by construction),
    random documents (not memorized), and documents too short for the split."""
    s = config.suffix_len
    docs, memorized = [], set()
    for i in range(5):
        prefix = random_ids(config.prefix_len or 10 + 3 * i, seed=100 + i)
        cont = greedy_decode(model, [prefix], s, pad_token_id=0)[0]
        tail = random_ids(7, seed=200 + i) if config.prefix_len else []  # Pythia split ignores the tail
        docs.append(Doc(f"mem{i}", prefix + cont + tail))
        memorized.add(f"mem{i}")
    for i in range(4):
        docs.append(Doc(f"rand{i}", random_ids(config.min_tokens() + 5 * i, seed=300 + i)))
    docs.append(Doc("short0", random_ids(config.min_tokens() - 1, seed=400)))
    docs.append(Doc("short1", [7]))
    return docs, memorized


@pytest.mark.parametrize("prefix_len", [None, 12], ids=["goldfish-split", "pythia-split"])
def test_extract_both_protocols(llama, prefix_len, tmp_path):
    config = ExtractionConfig(suffix_len=16, prefix_len=prefix_len, batch_size=4)
    docs, memorized = make_docs(llama, config)
    rows, summary = extract(llama, docs, config, decode=decode, pad_token_id=0, progress=False)

    assert summary["n_docs"] == 9 and len(rows) == 9
    assert summary["n_skipped_too_short"] == 2 and summary["skipped_ids"] == ["short0", "short1"]
    assert [r["id"] for r in rows] == [d.id for d in docs[:9]]  # input order kept
    # Near-tie record: every row has one; the summary names the smallest.
    assert all(r["min_logit_margin"] > 0 and 0 <= r["min_margin_position"] < 16 for r in rows)
    smallest = min(rows, key=lambda r: r["min_logit_margin"])
    assert summary["near_tie"] == {
        "min_logit_margin": smallest["min_logit_margin"],
        "id": smallest["id"],
        "position": smallest["min_margin_position"],
    }
    assert summary["rouge"]["default_tokenizer_discards_most"]["n_docs"] == 0
    by_id = {r["id"]: r for r in rows}
    for doc_id in memorized:
        r = by_id[doc_id]
        assert r["exact_match"] and r["match_fraction"] == 1.0 and r["longest_correct_prefix"] == 16
        assert r["rouge_l"] == 1.0 and r["generated_text"] == r["reference_text"]
    for i in range(4):
        r = by_id[f"rand{i}"]
        # A random 16-token suffix over 256 ids is reproduced with negligible probability.
        assert not r["exact_match"] and r["match_fraction"] < 0.5
    doc0 = docs[0]
    assert by_id["mem0"]["n_prefix_tokens"] == (prefix_len or len(doc0.token_ids) - 16)
    assert by_id["mem0"]["generated_ids"] == (doc0.token_ids[-16:] if prefix_len is None else doc0.token_ids[12:28])

    assert summary["exact_match"] == pytest.approx(5 / 9)
    for name in ("match_fraction", "rouge_l", "rouge_l_recall", "rouge_1", "rouge_2", "tf_accuracy"):
        assert summary[name] == pytest.approx(sum(r[name] for r in rows) / 9)
    assert summary["tf_kept_accuracy"] is None and summary["tf_dropped_accuracy"] is None
    assert summary["config"] == {"suffix_len": 16, "prefix_len": prefix_len, "batch_size": 4, "bootstrap": 1000}
    for name in ("exact_match", "rouge_l"):  # 95% percentile bootstrap over the 9 documents, around the mean
        low, high = summary[f"{name}_ci"]
        assert low <= summary[name] <= high and low < high
    assert summary["exact_match_ci"] == mean_interval([r["exact_match"] for r in rows])
    assert summary["rouge"]["package"] == "rouge-score" and summary["rouge"]["stemmer"] is False

    write_extraction(rows, summary, tmp_path / "out")
    lines = (tmp_path / "out" / "extraction.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == rows
    assert json.loads((tmp_path / "out" / "summary.json").read_text()) == summary
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["extraction.jsonl", "summary.json"]


class CountingWrapper(torch.nn.Module):
    """A model behind a plain wrapper, as eval/ sees a ParallelEvalModel: not a PreTrainedModel, so extraction
    leaves the KV cache to the model (HF's dynamic cache) instead of giving it a preallocated one. Counts forward
    calls."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.calls = 0
        self.decode_cache_columns = 0  # the longest cache a decoding step has attended over

    @property
    def config(self):
        return self.model.config

    def forward(self, **kwargs):
        self.calls += 1
        cache = kwargs.get("cache", kwargs.get("past_key_values"))  # renamed `cache` in transformers 5.24
        if kwargs["input_ids"].shape[1] == 1 and cache is not None:  # a decoding step
            self.decode_cache_columns = max(self.decode_cache_columns, cache.get_seq_length())
        return self.model(**kwargs)


@pytest.mark.parametrize("cache", ["preallocated", "dynamic"])
@pytest.mark.parametrize("prefix_len", [None, 9], ids=["goldfish-split", "pythia-split"])
def test_extract_shares_one_pass_and_decodes_only_after_the_first_mismatch(llama, prefix_len, cache):
    """extract() reads the greedy path off its teacher-forced pass while the path follows the true suffix and
    decodes only the steps after a batch's first mismatch. Documents follow the model's own greedy continuation
    for k of the S suffix tokens and then leave it (k = 0 .. S, mixed within batches, prefixes of different
    lengths, Pythia tails of different lengths): every row's ids must equal greedy decoding from its prefix
    at batch 1 (equal to HF generate: test_batched_equals_single_equals_hf_generate), its near-tie record the
    decoding's, on the preallocated cache and HF's dynamic one alike."""
    s = 10
    model = llama if cache == "preallocated" else CountingWrapper(llama)
    follow = [0, 3, s, 7, 1, s, 9, s - 1]  # greedy tokens each document's suffix keeps before it leaves the path
    docs, prefixes = [], []
    for i, k in enumerate(follow):
        prefix = random_ids(prefix_len or 6 + 2 * i, seed=500 + i)
        greedy = greedy_decode(llama, [prefix], s, pad_token_id=0)[0]
        suffix = greedy[:k] + [(t + 1) % VOCAB for t in greedy[k:]]  # leaves the greedy path at k (if k < s)
        tail = random_ids(3 * i, seed=600 + i) if prefix_len else []
        docs.append(Doc(f"d{i}", prefix + suffix + tail))
        prefixes.append(prefix)
    expected = greedy_paths(llama, prefixes, s, pad_token_id=0, batch_size=1)
    for batch_size in (3, 8):
        config = ExtractionConfig(suffix_len=s, prefix_len=prefix_len, batch_size=batch_size, bootstrap=0)
        rows, _ = extract(model, docs, config, decode=decode, pad_token_id=0, progress=False)
        assert [r["generated_ids"] for r in rows] == [p.ids for p in expected]
        assert [r["longest_correct_prefix"] for r in rows] == follow
        # Margins come from the forced pass (up to the first mismatch) or from a decoding step: the same logits
        # up to float32 rounding of differently shaped matmuls (~1e-6 of logits of order 10).
        assert [r["min_logit_margin"] for r in rows] == pytest.approx([p.min_margin for p in expected], abs=1e-4)
        assert [r["min_margin_position"] for r in rows] == [p.min_margin_position for p in expected]

    if cache == "dynamic":
        # Decoding attends over prefix + suffix + the steps decoded so far, never over a Pythia document's tail
        # (up to 21 tokens here): the tail's predictions come from a second pass.
        assert 0 < model.decode_cache_columns < (prefix_len or 20) + 2 * s
        # A batch of memorized documents is read off its one forced pass (two with tails): nothing to decode.
        memorized = [d for d, k in zip(docs, follow) if k == s]
        passes = 2 if prefix_len else 1
        model.calls = 0
        config = ExtractionConfig(suffix_len=s, prefix_len=prefix_len, batch_size=len(memorized), bootstrap=0)
        rows, _ = extract(model, memorized, config, decode=decode, pad_token_id=0, progress=False)
        assert model.calls == passes and all(r["exact_match"] for r in rows)
        model.calls = 0  # one mismatch at step 7 (the k = 7 document) leaves s - 8 steps to decode
        config = ExtractionConfig(suffix_len=s, prefix_len=prefix_len, batch_size=8, bootstrap=0)
        extract(model, memorized + [docs[3]], config, decode=decode, pad_token_id=0, progress=False)
        assert model.calls == passes + (s - 8)


@pytest.mark.parametrize("cache", ["preallocated", "dynamic"])
@pytest.mark.parametrize("prefix_len", [None, 9], ids=["goldfish-split", "pythia-split"])
def test_extraction_log_probabilities_equal_a_direct_teacher_forced_pass(llama, prefix_len, cache):
    """generated_logprob_mean and suffix_logprob_mean, read off the extraction's own passes (forced logits up to the
    first mismatch, decoding steps after it), equal the mean log-probability of the generated ids and of the true
    suffix ids in a separate right-padded forward over prefix + continuation (eval.logprobs.token_log_probs), for
    documents that follow the greedy path for k = 0 .. S tokens, batched with others of different lengths."""
    s = 8
    model = llama if cache == "preallocated" else CountingWrapper(llama)
    follow = [0, 3, s, 5, 1, s - 1]
    docs, prefixes, suffixes = [], [], []
    for i, k in enumerate(follow):
        prefix = random_ids(prefix_len or 5 + 3 * i, seed=700 + i)
        greedy = greedy_decode(llama, [prefix], s, pad_token_id=0)[0]
        suffix = greedy[:k] + [(t + 7) % VOCAB for t in greedy[k:]]
        tail = random_ids(2 * i + 1, seed=800 + i) if prefix_len else []
        docs.append(Doc(f"d{i}", prefix + suffix + tail))
        prefixes.append(prefix)
        suffixes.append(suffix)
    config = ExtractionConfig(suffix_len=s, prefix_len=prefix_len, batch_size=4, bootstrap=0)
    rows, summary = extract(model, docs, config, decode=decode, pad_token_id=0, progress=False)
    generated = [prefix + r["generated_ids"] for prefix, r in zip(prefixes, rows)]
    true = [prefix + suffix for prefix, suffix in zip(prefixes, suffixes)]
    # entry j of token_log_probs scores token j + 1: the S continuation ids are the last S entries
    direct_generated = [float(lp[-s:].mean()) for lp in token_log_probs(llama, generated, pad_token_id=0)]
    direct_true = [float(lp[-s:].mean()) for lp in token_log_probs(llama, true, pad_token_id=0)]
    assert [r["generated_logprob_mean"] for r in rows] == pytest.approx(direct_generated, abs=1e-4)
    assert [r["suffix_logprob_mean"] for r in rows] == pytest.approx(direct_true, abs=1e-4)
    for r, k in zip(rows, follow):
        assert r["generated_logprob_mean"] <= 0 and r["suffix_logprob_mean"] <= 0
        if k == s:  # a suffix that keeps to the greedy ids has their log-probabilities
            assert r["generated_logprob_mean"] == pytest.approx(r["suffix_logprob_mean"], abs=1e-6)
    assert summary["suffix_logprob_mean"] == pytest.approx(sum(direct_true) / len(rows), abs=1e-4)
    # greedy_paths (no true suffix) carries the generated ids' log-probability and no reference one
    paths = greedy_paths(llama, prefixes, s, pad_token_id=0, batch_size=3)
    assert [p.logprob_mean for p in paths] == pytest.approx(direct_generated, abs=1e-4)
    assert all(p.reference_logprob_mean is None for p in paths)


@pytest.mark.parametrize("prefill_tokens", [1, 7, 40])
def test_prompts_fed_through_the_cache_in_chunks_decode_alike(llama, monkeypatch, prefill_tokens):
    """PREFILL_TOKENS bounds the tokens of one forward while prompts go through the KV cache: chunks of one column,
    chunks that end inside the left padding and chunks of several columns give the ids, near-tie records and
    teacher-forced accuracies of a single forward (batches of 4 rows: chunks of 1, 1 and 10 columns)."""
    import eval.decoding

    prefixes = [random_ids(n, 70 + n) for n in (4, 11, 7, 20, 2, 15)]
    config = ExtractionConfig(suffix_len=8, batch_size=4, bootstrap=0)
    docs, _ = make_docs(llama, config)
    whole = greedy_paths(llama, prefixes, 9, pad_token_id=0, batch_size=4)
    whole_rows, _ = extract(llama, docs, config, decode=decode, pad_token_id=0, progress=False)
    monkeypatch.setattr(eval.decoding, "PREFILL_TOKENS", prefill_tokens)
    chunked = greedy_paths(llama, prefixes, 9, pad_token_id=0, batch_size=4)
    rows, _ = extract(llama, docs, config, decode=decode, pad_token_id=0, progress=False)
    assert [p.ids for p in chunked] == [p.ids for p in whole]
    # Float32 rounding of differently shaped matmuls only (~1e-6 of logits of order 10).
    assert [p.min_margin for p in chunked] == pytest.approx([p.min_margin for p in whole], abs=1e-4)
    for name in ("generated_ids", "tf_accuracy", "min_margin_position", "exact_match"):
        assert [r[name] for r in rows] == [r[name] for r in whole_rows]
    for name in ("generated_logprob_mean", "suffix_logprob_mean"):  # read off chunks of the forced pass
        assert [r[name] for r in rows] == pytest.approx([r[name] for r in whole_rows], abs=1e-5)


def test_extract_teacher_forced_kept_vs_dropped(llama):
    """Mark the suffix targets of a self-generated document as dropped: the model predicts each of them
    (they are its own greedy choices), so dropped accuracy is exactly 1 and the counts add up."""
    config = ExtractionConfig(suffix_len=16, batch_size=2)
    docs, _ = make_docs(llama, config)
    docs = docs[:5]

    seen = []

    def suffix_dropped(targets: torch.Tensor) -> torch.Tensor:  # (1, T) -> (1, T) bool
        seen.append(targets)
        dropped = torch.zeros_like(targets, dtype=torch.bool)
        dropped[:, -17:] = True  # the 16 suffix targets, and the ignored last position (must not count)
        return dropped

    rows, summary = extract(
        llama, docs, config, decode=decode, pad_token_id=0, drop_mask_fn=suffix_dropped, progress=False
    )
    # Training's convention: targets[j] = token j+1, last position ignored; one call per document (in batch order).
    assert sorted(t.tolist() for t in seen) == sorted([doc.token_ids[1:] + [-100]] for doc in docs)
    for r, doc in zip(rows, docs):
        assert r["tf_dropped_accuracy"] == 1.0
        n = len(doc.token_ids) - 1  # targets per document
        assert r["tf_accuracy"] == pytest.approx((r["tf_kept_accuracy"] * (n - 16) + 16) / n)
    assert summary["tf_dropped_accuracy"] == 1.0 and summary["tf_kept_accuracy"] < 0.5

    with pytest.raises(ValueError, match="drop_mask_fn must return"):
        extract(
            llama,
            docs,
            config,
            decode=decode,
            pad_token_id=0,
            progress=False,
            drop_mask_fn=lambda t: torch.zeros_like(t),
        )


def test_extract_rejects_documents_longer_than_the_context(llama):
    with pytest.raises(ValueError, match="longer than the model's context of 512 tokens; truncate"):
        extract(
            llama, [Doc("long", random_ids(513, 1))], ExtractionConfig(), decode=decode, pad_token_id=0, progress=False
        )


def test_extract_all_too_short(llama):
    rows, summary = extract(
        llama, [Doc("a", [1, 2])], ExtractionConfig(suffix_len=4), decode=decode, pad_token_id=0, progress=False
    )
    assert rows == [] and summary["n_docs"] == 0 and summary["n_skipped_too_short"] == 1
    assert summary["exact_match"] is None


def test_bench_script_runs_and_agrees(tmp_path, monkeypatch):
    """The benchmark's own identity check on a minute model (keeps bench/extraction.py from rotting)."""
    import runpy
    from pathlib import Path

    bench_dir = Path(__file__).parents[2] / "bench"
    monkeypatch.syspath_prepend(str(bench_dir))  # as `python bench/extraction.py` does: bench/common.py importable
    bench = runpy.run_path(str(bench_dir / "extraction.py"))
    out = tmp_path / "bench.json"
    argv = [
        "--n-docs",
        "3",
        "--doc-len",
        "24",
        "--suffix-len",
        "6",
        "--batch-size",
        "2",
        "--hidden",
        "32",
        "--layers",
        "1",
        "--vocab",
        "128",
        "--rounds",
        "2",
        "--json",
        str(out),
    ]
    assert bench["main"](argv) == 0
    figures = json.loads(out.read_text())
    assert figures["identical_ids"] is True and figures["rounds"] == 2
    assert figures["onednn_linears"] == eval.decoding.ONEDNN_LINEARS and figures["machine"]["cpus"] > 0
    for case in ("equal", "unequal"):  # HF generate batched, left-padded where the prefixes differ
        assert figures[case]["n_docs"] == 3 and figures[case]["identical_ids"] is True
        assert figures[case]["speedup_batched_vs_hf_batched"] > 0 and figures[case]["prompt_pass_docs_per_s"] > 0
        assert figures[case]["speedup_batched_torch_gemm_vs_hf_batched"] > 0
        assert figures[case]["seconds"].keys() == figures[case]["cpu_seconds"].keys() >= {"hf_batched", "batched"}
    assert figures["unequal"]["prefix_len_min"] < figures["unequal"]["prefix_len_max"]


def test_result_files_hold_infinities_as_valid_json(tmp_path):
    import json
    import math

    from data.atomic import write_json_atomic, write_jsonl_atomic

    # Samples needed for a suffix sampling can never emit is infinite; the files must still be strict JSON.
    row = {"id": "a", "samples_needed": {"0.9": math.inf}, "log_q": -math.inf, "bad": [math.nan, 1.5]}
    write_jsonl_atomic(tmp_path / "rows.jsonl", [row])
    write_json_atomic(tmp_path / "summary.json", {"rows": [row]})
    strict = dict(parse_constant=lambda token: pytest.fail(f"non-standard JSON token {token}"))
    back = json.loads((tmp_path / "rows.jsonl").read_text(), **strict)
    assert back == {"id": "a", "samples_needed": {"0.9": "inf"}, "log_q": "-inf", "bad": ["nan", 1.5]}
    assert float(back["samples_needed"]["0.9"]) == math.inf
    assert json.loads((tmp_path / "summary.json").read_text(), **strict)["rows"] == [back]
    assert [p.name for p in tmp_path.iterdir()] and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_non_latin_text_is_scored_and_flagged(llama, caplog):
    """A memorized document whose text is Hebrew: the paper's RougeL sees nothing (0), the Unicode RougeL sees the
    match (1), and the summary flags the document and logs a warning."""
    hebrew = lambda ids: " ".join(chr(0x5D0 + i % 27) * 3 for i in ids)  # noqa: E731
    prefix = random_ids(10, seed=7)
    doc = Doc("he", prefix + greedy_decode(llama, [prefix], 8, pad_token_id=0)[0])
    with caplog.at_level("WARNING", logger="eval.extraction"):
        rows, summary = extract(
            llama, [doc], ExtractionConfig(suffix_len=8), decode=hebrew, pad_token_id=0, progress=False
        )
    assert rows[0]["exact_match"] and rows[0]["rouge_l"] == 0.0 and rows[0]["rouge_l_unicode"] == 1.0
    assert rows[0]["rouge_default_kept_chars"] == 0.0
    assert summary["rouge"]["default_tokenizer_discards_most"] == {"n_docs": 1, "ids": ["he"], "min_kept_fraction": 0.5}
    assert summary["rouge_l_unicode"] == 1.0 and "discards most characters" in caplog.text
