"""What ReAtt offers, registered by name.

:mod:`jaxfid.methods` imports this module (as it imports every method's
``plugin``); nothing else needs to. ReAtt offers

* its task, ``METHOD = @reatt_task.ReAttTask()`` (``gin/reatt/*.gin``; gin
  imports :mod:`jaxfid.reatt.task` when it reads the file);
* its MODEL_DIR loader ``"reatt"`` (:func:`jaxfid.reatt.checkpoint.
  load_reatt`, registered by :mod:`jaxfid.reatt.checkpoint`);
* its ``jaxfid eval`` evaluator ``"reatt"``: FiD's
  (:class:`~jaxfid.fid.checkpoint_eval.FidCheckpointEvaluator`; the
  retrieval head does not change the answers' decoding);
* its index type ``"reatt"`` (the token index, registered by
  :mod:`jaxfid.reatt.token_index`) and ``jaxfid index reatt``;
* its command ``jaxfid reatt adapt|iterate``, with ``iterate``'s gin reads
  (:mod:`jaxfid.reatt.commands`).
"""
from __future__ import annotations

from jaxfid.commands import seqio_eval
from jaxfid.commands.registry import INDEX_COMMANDS, register_command
from jaxfid.fid.checkpoint_eval import FidCheckpointEvaluator
from jaxfid.reatt import checkpoint, commands, token_index

METHOD = checkpoint.METHOD

seqio_eval.METHODS.register(METHOD, FidCheckpointEvaluator)
INDEX_COMMANDS.register(token_index.INDEX_TYPE, commands.add_index_parser)
register_command(commands.COMMAND)
