"""The gin entry point of ``jaxfid train``: run files bind ``run.train_fn``.

FiD files bind ``launch.run.train_fn = @trainer.train``; ReAtt and ReFusion
files bind their own trainers, so one command serves every method.
"""
from __future__ import annotations

from typing import Callable


def run(train_fn: Callable[[], dict]) -> dict:
  return train_fn()
