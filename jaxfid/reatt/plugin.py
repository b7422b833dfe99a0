"""What ReAtt offers, registered by name (imported by :mod:`jaxfid.methods`).

Its task (``gin/reatt/*.gin``), MODEL_DIR loader ``"reatt"``, ``jaxfid
eval`` evaluator ``"reatt"`` (FiD's), index type ``"reatt"`` with ``jaxfid
index reatt``, and the command ``jaxfid reatt adapt|iterate``.
"""
from __future__ import annotations

from jaxfid.commands import seqio_eval
from jaxfid.commands.registry import INDEX_COMMANDS, register_command
from jaxfid.reader.checkpoint_eval import FidCheckpointEvaluator
from jaxfid.reatt import checkpoint, commands, token_index

METHOD = checkpoint.METHOD

seqio_eval.METHODS.register(METHOD, FidCheckpointEvaluator)
INDEX_COMMANDS.register(token_index.INDEX_TYPE, commands.add_index_parser)
register_command(commands.COMMAND)
