"""Data readers, formats and pipelines (never imports a model)."""
