"""The goldfish paper's main setting (Hans et al. 2024, "Be like a Goldfish, Don't Memorize!"), written out once.

    TINYLLAMA          the TinyLlama-1.1B architecture the paper trains from scratch (sizes of its published config)
    MODEL ... MASKS    the model, tokenizer, canaries, background, step and masks of that setting, which the presets
                       `goldfish compare --preset paper` and `goldfish plan --preset paper` put together
                       (goldfish.app.presets.paper_setting and paper_plan)
    RELEASED           the checkpoints the authors published on the Hugging Face hub, by compare label
    check_hub          fail at once, in one line, when the hub the preset needs cannot be reached

Plain Python (no torch): `goldfish plan` imports it. docs/corpus.md ("The paper's setting") says which figures come
from the paper and its released configuration and which are choices of ours.
"""

from __future__ import annotations

import os
import socket
from typing import Any, Sequence
from urllib.parse import urlparse

# TinyLlama-1.1B (the config of TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T): Llama with grouped-query
# attention, 22 layers, hidden 2048, 32 heads over 4 key/value heads, SwiGLU MLP 5632, vocabulary 32,000.
TINYLLAMA: dict[str, Any] = dict(
    hidden=2048,
    layers=22,
    heads=32,
    kv_heads=4,
    intermediate=5632,
    vocab=32000,
    max_positions=2048,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
)
MODEL = "tinyllama-1.1b"  # goldfish.app.models builds it at random init from TINYLLAMA
TOKENIZER = "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T"  # the reference run's tokenizer
CANARIES = "tomg-group-umd/wikipedia-en-2k-samples"  # the canary set the released model cards name
# The paper's background is a RedPajama-V2 sample tokenized offline; the hub's RedPajama-V2 loads only through a
# loading script, which goldfish never runs. SlimPajama (RedPajama-1T cleaned and deduplicated) streams as plain
# files: the closest background the hub serves to `datasets` without code.
BACKGROUND = "cerebras/SlimPajama-627B"
SEQ_LEN = 2048
BATCH = 1024  # sequences per optimizer step: 2,097,152 tokens
TOKENS = 20_000_000_000
STEPS = -(-TOKENS // (BATCH * SEQ_LEN))  # 9,537
MASKS = [f"hashed:{k}:13" for k in (3, 4, 8, 32, 128)]

# The paper's runs: 16 Frontier nodes (128 MI250X GCDs), one model per job (goldfish.app.presets.paper_plan).
PLAN_STEPS = STEPS
PLAN_MODELS = 1 + len(MASKS)  # compare trains the standard model and one per mask (its control is not trained)

# The published checkpoints (model cards of tomg-group-umd/*-llama-1B), by the label `goldfish compare` gives the
# model trained with that loss. The paper's control was trained on the background alone (no canaries).
RELEASED: dict[str, str] = {
    "control": "tomg-group-umd/control-llama-1B",
    "standard": "tomg-group-umd/standard-loss-llama-1B",
    **{f"goldfish-hashed-k{k}-h13": f"tomg-group-umd/{k}-goldfish-loss-llama-1B" for k in (3, 4, 8, 32, 128)},
}

HUB = "https://huggingface.co"
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def check_hub(names: Sequence[str], *, timeout: float = 5.0) -> None:
    """Refuse at once (ValueError, one line) a run that needs the hub for `names` when the hub's host cannot be
    reached: `datasets` and `transformers` would otherwise retry for about half a minute and print every retry.
    The endpoint is HF_ENDPOINT's (default huggingface.co). Skipped with HF_HUB_OFFLINE / HF_DATASETS_OFFLINE set:
    the user then means the local cache."""
    if not names or any(os.environ.get(name, "").strip() not in ("", "0") for name in OFFLINE_VARIABLES):
        return
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", HUB))
    host = endpoint.hostname or ""
    port = endpoint.port or (80 if endpoint.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return
    except OSError as error:
        reason = error.strerror or type(error).__name__
    raise ValueError(
        f"this run needs the Hugging Face hub for {', '.join(names)}, and {host}:{port} cannot be reached "
        f"({reason}). Fix: run it where the hub is reachable (a GPU cluster's login node can fill the cache first), "
        "or give local --data/--background/--tokenizer/--checkpoints"
    )
