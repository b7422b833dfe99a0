"""Networks: T5 and the retrieval-augmented models built on it."""
