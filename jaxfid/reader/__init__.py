"""The reader every method builds on: T5 reading a question's passages."""
