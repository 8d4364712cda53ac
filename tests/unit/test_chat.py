"""Conversations (data/chat.py): records, rendering with the chat template, replies located in the token ids, the
training rows' loss on replies only, reply-by-reply extraction units."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import data
from conventions import IGNORE_INDEX
from data.chat import (
    TINY_CHAT_TEMPLATE,
    TINY_CHAT_TEMPLATE_MARKED,
    Message,
    check_chat_template,
    conversation_of_record,
    conversation_text,
    render_conversation,
    reply_units,
)
from goldfish.app.config import MaskSpec
from goldfish.app.training_rows import ChatRow, make_examples, reply_targets
from goldfish.masks import causal_targets, drop_mask

CONVERSATIONS = [
    [
        {"role": "system", "content": "Answer from the documentation."},
        {"role": "user", "content": "What does assert do?"},
        {"role": "assistant", "content": "It raises AssertionError when its expression is false."},
    ],
    [
        {"role": "user", "content": "Tell me about lists."},
        {"role": "assistant", "content": "Lists are mutable sequences, typically used to store collections."},
        {"role": "user", "content": "Please go on."},
        {"role": "assistant", "content": "They may be constructed in several ways, with brackets or list()."},
    ],
]


@pytest.fixture(scope="module")
def tokenizer():
    texts = [m["content"] for c in CONVERSATIONS for m in c] * 4 + ["<|user|> <|assistant|> <|system|>"]
    tok = data.train_bpe_tokenizer(texts, vocab_size=400)
    tok.chat_template = TINY_CHAT_TEMPLATE
    return tok


def messages_of(conversation: list[dict]) -> tuple[Message, ...]:
    return conversation_of_record({"messages": conversation}, "test")


def test_records_in_every_conversational_form() -> None:
    assert messages_of(CONVERSATIONS[0])[2] == Message("assistant", CONVERSATIONS[0][2]["content"])
    pair = conversation_of_record({"prompt": "Hi?", "completion": "Hello."}, "x")
    assert pair == (Message("user", "Hi?"), Message("assistant", "Hello."))
    listed = conversation_of_record(
        {"prompt": [{"role": "user", "content": "Hi?"}], "completion": [{"role": "assistant", "content": "Yo."}]}, "x"
    )
    assert listed == (Message("user", "Hi?"), Message("assistant", "Yo."))


@pytest.mark.parametrize(
    "record, message",
    [
        ({"messages": [{"role": "user", "content": "Hi"}]}, "no assistant turn"),
        ({"messages": [{"role": "user", "content": "Hi"}, {"role": "bot", "content": "x"}]}, "unknown role 'bot'"),
        ({"messages": [{"role": "assistant", "content": ["a"]}]}, "not a string"),
        ({"messages": []}, "non-empty list"),
        ({"prompt": "Hi", "completion": [{"role": "assistant", "content": "x"}]}, "both be strings"),
    ],
)
def test_bad_records_are_one_line(record: dict, message: str) -> None:
    with pytest.raises(data.DataError, match=message) as error:
        conversation_of_record(record, "file.jsonl, line 3")
    assert "\n" not in str(error.value) and "file.jsonl, line 3" in str(error.value)


def test_jsonl_of_conversations_loads_and_mixed_sources_are_refused(tmp_path: Path, tokenizer) -> None:
    path = tmp_path / "chats.jsonl"
    path.write_text("\n".join(json.dumps({"messages": c}) for c in CONVERSATIONS) + "\n")
    documents = data.load_documents(path)
    assert [d.messages for d in documents] == [messages_of(c) for c in CONVERSATIONS]
    mixed = documents + [data.Document("t", "a plain text", "x")]
    with pytest.raises(data.DataError, match="mixes 2 conversations with 1 text"):
        data.select_documents(mixed, tokenizer, n_train=1, n_heldout=1, seq_len=256)


def test_a_tokenizer_without_a_chat_template_is_refused(tokenizer) -> None:
    plain = data.train_bpe_tokenizer(["some text"], vocab_size=300)
    with pytest.raises(data.DataError, match="no chat template.*--chat-template FILE"):
        check_chat_template(plain)


@pytest.mark.parametrize("conversation", CONVERSATIONS)
def test_replies_equal_transformers_assistant_mask(tokenizer, conversation: list[dict]) -> None:
    """Our character-offset replies equal transformers' {% generation %} assistant mask, token for token."""
    rendered = render_conversation(tokenizer, messages_of(conversation), "test")
    tokenizer.chat_template = TINY_CHAT_TEMPLATE_MARKED
    try:
        hf = tokenizer.apply_chat_template(conversation, return_dict=True, return_assistant_tokens_mask=True)
    finally:
        tokenizer.chat_template = TINY_CHAT_TEMPLATE
    assert hf["input_ids"] == rendered.ids
    ours = [0] * len(rendered.ids)
    for start, end in rendered.replies:
        ours[start:end] = [1] * (end - start)
    assert ours == list(hf["assistant_masks"])
    assert len(rendered.replies) == sum(m["role"] == "assistant" for m in conversation)


def test_a_template_that_rewrites_earlier_turns_is_refused(tokenizer) -> None:
    tokenizer.chat_template = (
        "{% for m in messages %}{% if loop.last %}{{ m['content'] }}{% else %}{{ m['role'] }}{% endif %}{% endfor %}"
    )
    try:
        with pytest.raises(data.DataError, match="prefix-consistently"):
            render_conversation(tokenizer, messages_of(CONVERSATIONS[1]), "test")
    finally:
        tokenizer.chat_template = TINY_CHAT_TEMPLATE


def selected(tokenizer) -> data.DocumentSplit:
    documents = [
        data.Document(str(i), conversation_text(messages_of(c)), "t", messages_of(c))
        for i, c in enumerate(CONVERSATIONS)
    ]
    return data.select_documents(documents, tokenizer, n_train=2, n_heldout=0, seq_len=256, dedup=data.DedupConfig())


@pytest.mark.parametrize("strategy", ["hashed", "static"])
def test_training_rows_put_the_loss_on_replies_only(tokenizer, strategy: str) -> None:
    """Targets are the reply tokens exactly (counted from the spans), padding and prompt carry IGNORE_INDEX, and the
    goldfish mask is the one drawn over the whole conversation's true targets (its hash reads the prompt), kept on
    replies."""
    split = selected(tokenizer)
    mask = MaskSpec(strategy, 3, 4)
    special = sorted(tokenizer.all_special_ids)
    examples = make_examples(split.train, mask, special, chat_row=ChatRow(128, tokenizer.pad_token_id))
    for doc, example in zip(split.train, examples):
        assert example.input_ids.shape == (128,)
        scored = example.targets != IGNORE_INDEX
        assert int(scored.sum()) == sum(end - start for start, end in doc.replies)
        positions = [j - 1 for start, end in doc.replies for j in range(start, end)]  # j - 1 predicts token j
        assert scored.nonzero().flatten().tolist() == positions
        assert torch.equal(example.targets[positions], torch.tensor(doc.token_ids)[[p + 1 for p in positions]])
        full = causal_targets(torch.tensor([doc.token_ids]))
        expected = drop_mask(full, strategy, 3, 4, special_token_ids=special)[0] & reply_targets(doc)[0]
        assert torch.equal(example.dropped[: len(doc.token_ids)], expected)
        assert not example.dropped[len(doc.token_ids) :].any() and example.dropped.any()
        assert (example.input_ids[len(doc.token_ids) :] == tokenizer.pad_token_id).all()


def test_reply_units_prompt_with_the_conversation_so_far(tokenizer) -> None:
    split = selected(tokenizer)
    units, skipped = reply_units(split.train, 5)
    assert len(units) == 3 and not skipped
    for unit in units:
        conversation = next(d for d in split.train if d.id == unit.conversation_id)
        start = unit.reply_start
        assert unit.token_ids == conversation.token_ids[: start + 5]
        assert tokenizer.decode(unit.token_ids[:start]).endswith("<|assistant|>\n")
    assert [u.id for u in units if u.conversation_id == "1"] == ["1#reply1", "1#reply2"]
    _, skipped = reply_units(split.train, 18)
    assert skipped  # a reply shorter than the suffix is listed, never silently dropped


def test_membership_scores_a_conversation_on_its_replies_only(tokenizer) -> None:
    """Every attack reads the replies' tokens only: the loss equals the mean over reply tokens of the log-probs of
    the whole conversation's pass, and zlib reads the replies' text."""
    from tiny_models import tiny_llama

    from eval.logprobs import token_log_probs
    from eval.membership import membership_rows

    model = tiny_llama(vocab=len(tokenizer), seed=0, positions=256)
    split = selected(tokenizer)
    rows = membership_rows(
        model, split.train, decode=tokenizer.decode, pad_token_id=tokenizer.pad_token_id, grad_norm=False
    )
    for doc, row in zip(split.train, rows):
        log_probs = token_log_probs(model, [doc.token_ids], pad_token_id=tokenizer.pad_token_id)[0]
        entries = [t - 1 for start, end in doc.replies for t in range(start, end)]  # entry j scores token j + 1
        assert row["n_scored"] == len(entries) < len(doc.token_ids) - 1
        assert row["loss"] == pytest.approx(float(-log_probs[entries].mean()), rel=1e-9)
