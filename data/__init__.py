"""Documents in, training rows out: loaders, the default corpus, tokenizers, selection; whole documents packed
into rows (data.packing, data.rows) and targets inserted into a background corpus (data.corpus, data.background).

Imports nothing of the other project packages: the loss mask is handed in as a function (data.rows.RowMask).
"""

from data.dedup import DEDUP_MODES, DUPLICATE_POLICIES, DedupConfig
from data.documents import (
    DEFAULT_CHAT,
    DEFAULT_CORPUS,
    DEFAULT_PARAGRAPHS,
    Document,
    default_corpus,
    default_paragraphs,
    is_local_source,
    load_documents,
)
from data.errors import DataError
from data.selection import (
    DocumentSplit,
    TokenizedDocument,
    assign_buckets,
    check_document_count,
    select_documents,
    select_fitting_tokenizer,
)
from data.tokenizer import BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, load_tokenizer, train_bpe_tokenizer

__all__ = [
    "BOS_TOKEN",
    "DEFAULT_CHAT",
    "DEFAULT_CORPUS",
    "DEFAULT_PARAGRAPHS",
    "DEDUP_MODES",
    "DUPLICATE_POLICIES",
    "DataError",
    "DedupConfig",
    "Document",
    "DocumentSplit",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "TokenizedDocument",
    "assign_buckets",
    "check_document_count",
    "default_corpus",
    "default_paragraphs",
    "is_local_source",
    "load_documents",
    "load_tokenizer",
    "select_documents",
    "select_fitting_tokenizer",
    "train_bpe_tokenizer",
]
