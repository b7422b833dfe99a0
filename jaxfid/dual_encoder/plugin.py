"""What the T5 dual encoder offers, registered by name.

:mod:`jaxfid.methods` imports this module (as it imports every method's
``plugin``); nothing else needs to. The dual encoder offers

* its task, ``METHOD = @de_task.DualEncoderTask()``
  (``gin/retrieval/dual_encoder_*.gin``; gin imports
  :mod:`jaxfid.dual_encoder.task` when it reads the file);
* its MODEL_DIR loader ``"dual_encoder"`` (registered by
  :mod:`jaxfid.dual_encoder.checkpoint`);
* its index type ``"dense"`` (registered by :mod:`jaxfid.dual_encoder.index`)
  and ``jaxfid index dense`` / ``index import-embeddings``
  (:mod:`jaxfid.dual_encoder.commands`).

It has no ``jaxfid eval`` evaluator (a retriever is evaluated by ``jaxfid
eval-retrieval``) and no command of its own.
"""
from __future__ import annotations

from jaxfid.commands.registry import INDEX_COMMANDS
from jaxfid.dual_encoder import checkpoint, commands, index

METHOD = checkpoint.METHOD

INDEX_COMMANDS.register(index.INDEX_TYPE, commands.add_parser)
