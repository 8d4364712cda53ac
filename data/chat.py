"""Conversations: chat records -> messages -> token ids with the assistant's replies marked.

A conversation is a record with `messages` (a list of {"role", "content"}, the conversational format of TRL and the
HF hub) or with `prompt` and `completion` (strings, or lists of messages as TRL's conversational prompt-completion
format has them). It is rendered with the tokenizer's own chat template (`apply_chat_template`) and tokenized once;
each assistant reply is located in the token ids by character offsets, so training can put the loss on the
assistant's tokens only and extraction can prompt with everything before a reply.

What a reply covers: from the end of the assistant header the template writes for a generation prompt
(`add_generation_prompt=True`) to the end of that assistant message as the template renders it, so its closing
marker (an end-of-turn or EOS token) is part of the reply: a fine-tuned model learns to stop. A token that straddles
the boundary (a BPE merge across the header's end) counts as prompt.

Templates must render prefix-consistently (the rendering of the first n messages is the start of the rendering of
all of them); one that rewrites earlier turns (e.g. strips reasoning from past replies) is refused in one line.

Imports nothing of the other project packages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, get_args

from data.errors import DataError

Role = Literal["system", "user", "assistant", "tool"]  # a turn's speaker, as chat templates name it
ROLES: tuple[Role, ...] = get_args(Role)

# The chat template of the tiny models' trained BPE tokenizers (they have none of their own): each message as a role
# header line and its content, BOS first, the tokenizer's EOS closing each assistant reply.
TINY_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{{ '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
# The same template with HF's generation markers around each reply (its content, the EOS that closes it and the
# newline: what a reply covers here), for tools that read `return_assistant_tokens_mask` (TRL's assistant_only_loss;
# the tests, where transformers' mask is the reference our replies are checked against).
TINY_CHAT_TEMPLATE_MARKED = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + eos_token + '\\n' }}"
    "{% endgeneration %}{% else %}{{ message['content'] + '\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class Message:
    """One turn of a conversation: role in ROLES, content the text."""

    role: Role
    content: str


def is_conversation_record(fields: Mapping[str, Any], text_field: str) -> bool:
    """True when a record is a conversation (has `messages`, or `prompt` and `completion`) and not a text record."""
    if text_field in fields:
        return False
    return "messages" in fields or ("prompt" in fields and "completion" in fields)


def conversation_of_record(fields: Mapping[str, Any], where: str) -> tuple[Message, ...]:
    """The messages of a conversation record; DataError (naming `where`) for a malformed one: a message that is not
    an object with a string `role` and `content`, an unknown role, or no assistant turn."""
    if "messages" in fields:
        messages = _messages(fields["messages"], where, "messages")
    else:
        prompt, completion = fields["prompt"], fields["completion"]
        if isinstance(prompt, str) and isinstance(completion, str):
            messages = (Message("user", prompt), Message("assistant", completion))
        elif isinstance(prompt, list) and isinstance(completion, list):
            messages = _messages(prompt, where, "prompt") + _messages(completion, where, "completion")
        else:
            raise DataError(
                f"{where}: 'prompt' and 'completion' must both be strings or both be lists of messages, got "
                f"{type(prompt).__name__} and {type(completion).__name__}. Fix: write "
                '{"prompt": "...", "completion": "..."} or {"messages": [{"role": "user", "content": "..."}, ...]}.'
            )
    if not any(m.role == "assistant" for m in messages):
        raise DataError(
            f"{where}: the conversation has no assistant turn, so nothing in it would be trained on or extracted. "
            "Fix: add a message with role 'assistant', or leave the record out."
        )
    return messages


def _messages(value: Any, where: str, field: str) -> tuple[Message, ...]:
    if not isinstance(value, list) or not value:
        raise DataError(
            f"{where}: {field!r} must be a non-empty list of {{'role': ..., 'content': ...}} objects, got "
            f'{type(value).__name__}. Fix: write e.g. [{{"role": "user", "content": "Hi"}}, '
            '{"role": "assistant", "content": "Hello"}].'
        )
    out = []
    for index, item in enumerate(value):
        if not isinstance(item, Mapping) or not isinstance(item.get("role"), str) or "content" not in item:
            raise DataError(
                f"{where}: {field}[{index}] is not an object with a string 'role' and a 'content'. Fix: write "
                '{"role": "user", "content": "..."}.'
            )
        role, content = item["role"], item["content"]
        if role not in ROLES:
            raise DataError(
                f"{where}: {field}[{index}] has the unknown role {role!r}. Fix: use one of {', '.join(ROLES)}."
            )
        if not isinstance(content, str):
            raise DataError(
                f"{where}: {field}[{index}] ({role}) has a {type(content).__name__} content, not a string. Fix: "
                "store each message's text as a string (multimodal content parts are not supported)."
            )
        out.append(Message(role, content))
    return tuple(out)


def conversation_text(messages: Sequence[Message]) -> str:
    """The plain text of a conversation, roles included, for deduplication and content hashes (template-free, so
    two templates agree on which conversations are duplicates)."""
    return "\n\n".join(f"{m.role}: {m.content}" for m in messages)


@dataclass(frozen=True)
class RenderedConversation:
    """A conversation as token ids. ids: (T,) the rendered template tokenized (no special tokens added beyond
    what the template writes). replies: one [start, end) token span per assistant message, in order."""

    ids: list[int]
    replies: tuple[tuple[int, int], ...]


def check_chat_template(tokenizer: Any) -> None:
    """Refuse a tokenizer without a chat template, or a slow one (replies are found by character offsets)."""
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(
            "the tokenizer has no chat template, so conversations cannot be rendered as the model expects. Fix: "
            "give one with --chat-template FILE (a Jinja template as HF tokenizers use), or use a chat model's "
            "tokenizer."
        )
    if not getattr(tokenizer, "is_fast", False):
        raise DataError(
            "conversations need a fast tokenizer (replies are located by character offsets). Fix: use the model's "
            "fast tokenizer (tokenizer.json), or convert it with transformers."
        )


def _render(tokenizer: Any, messages: Sequence[Message], generation_prompt: bool) -> str:
    rendered = tokenizer.apply_chat_template(
        [{"role": m.role, "content": m.content} for m in messages],
        tokenize=False,
        add_generation_prompt=generation_prompt,
    )
    if not isinstance(rendered, str):
        raise DataError(f"the chat template rendered a {type(rendered).__name__}, not text. Fix: check the template.")
    return rendered


def render_conversation(tokenizer: Any, messages: Sequence[Message], where: str) -> RenderedConversation:
    """Render with the tokenizer's chat template and tokenize; locate each assistant reply's tokens.

    A token belongs to a reply when it starts at or after the reply's first character and before its end (see the
    module docstring for what a reply covers). DataError when the template does not render prefix-consistently or a
    reply has no token of its own.
    """
    full = _render(tokenizer, messages, generation_prompt=False)
    char_spans = []
    for index, message in enumerate(messages):
        if message.role != "assistant":
            continue
        head = _render(tokenizer, messages[:index], generation_prompt=True) if index else ""
        upto = _render(tokenizer, messages[: index + 1], generation_prompt=False)
        if not (full.startswith(head) and full.startswith(upto) and len(head) < len(upto)):
            raise DataError(
                f"{where}: the chat template does not render conversations prefix-consistently (the text before "
                f"reply {len(char_spans) + 1} differs from the start of the whole conversation), so replies cannot "
                "be located. Fix: give a template that renders earlier turns unchanged with --chat-template FILE."
            )
        char_spans.append((len(head), len(upto)))
    encoded = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(encoded["input_ids"]), encoded["offset_mapping"]
    replies = []
    for number, (first, last) in enumerate(char_spans, start=1):
        inside = [i for i, (start, _) in enumerate(offsets) if first <= start < last]
        if not inside:
            raise DataError(f"{where}: assistant reply {number} has no token of its own. Fix: give it some text.")
        replies.append((inside[0], inside[-1] + 1))
    return RenderedConversation(ids=ids, replies=tuple(replies))


def assistant_flags(n_tokens: int, replies: Sequence[tuple[int, int]]) -> list[bool]:
    """(T,) True at the tokens inside a reply."""
    flags = [False] * n_tokens
    for start, end in replies:
        flags[start:end] = [True] * (end - start)
    return flags


def reply_units(documents: Sequence[Any], suffix_len: int) -> tuple[list[Any], list[str]]:
    """Extraction units of conversations: one per assistant reply with at least `suffix_len` tokens.

    A unit's token_ids are the conversation up to the reply (the prompt: everything before, the assistant header
    included) and the reply's first suffix_len tokens, so extraction's default split (suffix = the last suffix_len
    tokens) prompts with the conversation so far and compares the reply. Its id is "<conversation id>#reply<n>"
    (n from 1), `reply_start` the prompt's length and `conversation_id` its conversation. Returns (units, ids of
    the replies skipped as shorter than suffix_len). Documents without replies are returned unchanged.
    """
    units: list[Any] = []
    skipped: list[str] = []
    for doc in documents:
        if doc.replies is None:
            units.append(doc)
            continue
        for number, (start, end) in enumerate(doc.replies, start=1):
            unit_id = f"{doc.id}#reply{number}"
            if end - start < suffix_len:
                skipped.append(unit_id)
                continue
            units.append(
                replace(
                    doc,
                    id=unit_id,
                    token_ids=list(doc.token_ids[: start + suffix_len]),
                    replies=None,
                    reply_start=start,
                    conversation_id=str(doc.id),
                    full_ids=None,
                )
            )
    return units, skipped
