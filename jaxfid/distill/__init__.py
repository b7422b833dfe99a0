"""FiD-KD: the reader's cross-attention scores distilled into the retriever."""
