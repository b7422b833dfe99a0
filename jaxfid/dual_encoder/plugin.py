"""What the T5 dual encoder offers, registered by name.

Its task (``gin/retrieval/dual_encoder_*.gin``), MODEL_DIR loader
``"dual_encoder"``, index type ``"dense"`` and ``jaxfid index dense`` /
``index import-embeddings``; no ``jaxfid eval`` evaluator.
"""
from __future__ import annotations

from jaxfid.commands.registry import INDEX_COMMANDS
from jaxfid.dual_encoder import checkpoint, commands, index

METHOD = checkpoint.METHOD

INDEX_COMMANDS.register(index.INDEX_TYPE, commands.add_parser)
