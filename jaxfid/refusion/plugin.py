"""What ReFusion offers, registered by name.

:mod:`jaxfid.methods` imports this module (as it imports every method's
``plugin``); nothing else needs to. ReFusion offers

* its task, ``METHOD = @refusion_task.ReFusionTask()``
  (``gin/refusion/*.gin``; gin imports :mod:`jaxfid.refusion.task` when it
  reads the file);
* its MODEL_DIR loader ``"refusion"`` (the backbone as a plain T5,
  registered by :mod:`jaxfid.refusion.checkpoint`, which also holds
  :func:`~jaxfid.refusion.checkpoint.load_refusion`);
* its ``jaxfid eval`` evaluator ``"refusion"``
  (:class:`~jaxfid.refusion.checkpoint_eval.ReFusionCheckpointEvaluator`:
  rank classification of the LM-BFF / GLUE prompt tasks), with the gin
  checks of its parameters;
* its command ``jaxfid refusion seeds``, with its gin reads
  (:mod:`jaxfid.refusion.commands`).
"""
from __future__ import annotations

from jaxfid.commands import seqio_eval
from jaxfid.commands.gin_specs import OPTIONAL_PATH, TABLE
from jaxfid.commands.registry import register_command
from jaxfid.core.gin_checks import flag
from jaxfid.refusion import checkpoint, commands
from jaxfid.refusion.checkpoint_eval import ReFusionCheckpointEvaluator

METHOD = checkpoint.METHOD

seqio_eval.METHODS.register(METHOD, ReFusionCheckpointEvaluator)
TABLE.add(ReFusionCheckpointEvaluator, neighbour_cache=OPTIONAL_PATH,
          progress=flag())
register_command(commands.COMMAND)
