"""Retrieval: corpora, BM25, dense and token indexes, search and metrics."""
