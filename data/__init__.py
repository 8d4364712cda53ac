"""Documents in, fixed-length token sequences out: loaders, the default corpus, tokenizers, selection.

Imports nothing of the other project packages.
"""

from data.dedup import DEDUP_MODES, DUPLICATE_POLICIES, DedupConfig
from data.documents import DEFAULT_CORPUS, Document, default_corpus, is_local_source, load_documents
from data.errors import DataError
from data.selection import DocumentSplit, TokenizedDocument, check_document_count, select_documents
from data.tokenizer import BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, load_tokenizer, train_bpe_tokenizer

__all__ = [
    "BOS_TOKEN",
    "DEFAULT_CORPUS",
    "DEDUP_MODES",
    "DUPLICATE_POLICIES",
    "DataError",
    "DedupConfig",
    "Document",
    "DocumentSplit",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "TokenizedDocument",
    "check_document_count",
    "default_corpus",
    "is_local_source",
    "load_documents",
    "load_tokenizer",
    "select_documents",
    "train_bpe_tokenizer",
]
