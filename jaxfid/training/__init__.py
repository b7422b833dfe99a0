"""Training: step functions, the trainer loop, checkpointing, metrics."""
