"""The embedded conversations ("default-chat"): a few hundred short chats derived from the embedded corpus.

Each paragraph of the embedded corpus (`default_paragraphs`: Python's own documentation topics, 628 in Python 3.11)
becomes one conversation, deterministically: a fixed system prompt; a user question naming the topic and the
paragraph's number in it (so the prompt identifies the passage, as a support ticket or a quoted book would); the
assistant answering with the paragraph's sentences, whitespace normalized, up to about 80 words. Every fourth
conversation has a second turn: the user asks to go on and the assistant gives the next sentences. No text is
invented: every reply is documentation text, every prompt is one of a few fixed question forms.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from data.chat import Message

SYSTEM_PROMPT = "You are a helpful assistant who answers from the Python documentation."
_QUESTIONS = (
    "What does the Python documentation say about {topic} (passage {n})?",
    "Can you quote passage {n} of the {topic} topic?",
    "I am reading about {topic}. What is in passage {n}?",
    "Explain passage {n} of the {topic} section, in the documentation's words.",
)
FOLLOW_UP = "Please go on."
_REPLY_WORDS = 40  # a reply takes whole sentences until it has at least this many words ...
_MAX_REPLY_WORDS = 80  # ... and is cut at this many words when one sentence runs longer
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def _replies(text: str, n: int) -> list[str]:
    """Up to `n` replies of consecutive whole sentences of `text` (whitespace normalized), each of at least
    _REPLY_WORDS words where the text allows and at most _MAX_REPLY_WORDS."""
    sentences = [s for s in _SENTENCE_END.split(" ".join(text.split())) if s]
    replies: list[str] = []
    current: list[str] = []
    for sentence in sentences:
        current.extend(sentence.split())
        if len(current) >= _REPLY_WORDS:
            replies.append(" ".join(current[:_MAX_REPLY_WORDS]))
            current = []
            if len(replies) == n:
                return replies
    if current and len(replies) < n:
        replies.append(" ".join(current[:_MAX_REPLY_WORDS]))
    return replies


def default_conversations(paragraphs: Sequence[Any]) -> list[tuple[str, tuple[Message, ...]]]:
    """(id, messages) of the embedded conversations, in paragraph order, from `default_paragraphs()` (documents with
    ids "<topic>#<paragraph>"); id = the paragraph's id."""
    conversations = []
    for index, paragraph in enumerate(paragraphs):
        topic, number = paragraph.id.split("#")
        question = _QUESTIONS[index % len(_QUESTIONS)].format(topic=topic, n=number)
        turns = 2 if index % 4 == 3 else 1
        replies = _replies(paragraph.text, turns)
        messages = [Message("system", SYSTEM_PROMPT), Message("user", question), Message("assistant", replies[0])]
        if len(replies) > 1:
            messages += [Message("user", FOLLOW_UP), Message("assistant", replies[1])]
        conversations.append((paragraph.id, tuple(messages)))
    return conversations


def conversation_records(paragraphs: Sequence[Any]) -> list[dict]:
    """The embedded conversations as records of the conversational format ({"id", "messages"}), what a user's
    jsonl would hold."""
    return [
        {"id": cid, "messages": [{"role": m.role, "content": m.content} for m in messages]}
        for cid, messages in default_conversations(paragraphs)
    ]
