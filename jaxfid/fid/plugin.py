"""What FiD, the built-in reader, offers, registered by name.

:mod:`jaxfid.methods` imports this module (as it imports every method's
``plugin``); nothing else needs to. FiD offers

* its task, ``METHOD = @fid_task.FidTask()`` (``gin/fid/*.gin``; gin imports
  :mod:`jaxfid.fid.task` when it reads the file);
* its MODEL_DIR loader ``"fid"``: the plain encoder-decoder one, built into
  :mod:`jaxfid.checkpoints.load` (what every T5 checkpoint without a run
  config loads as too);
* its ``jaxfid eval`` evaluator ``"fid"``
  (:class:`~jaxfid.fid.checkpoint_eval.FidCheckpointEvaluator`; also the
  evaluator of checkpoints without a run config,
  :data:`jaxfid.commands.seqio_eval.DEFAULT_METHOD`);
* its commands ``jaxfid predict``, ``plot``, ``bench`` and ``demo``
  (:mod:`jaxfid.fid.commands`), with the gin reads of ``bench`` and
  ``demo``.
"""
from __future__ import annotations

from jaxfid.commands import seqio_eval
from jaxfid.commands.registry import register_command
from jaxfid.fid.checkpoint_eval import FidCheckpointEvaluator
from jaxfid.fid.commands import bench, demo, plot, predict

METHOD = "fid"

seqio_eval.METHODS.register(METHOD, FidCheckpointEvaluator)
for _command in (predict.COMMAND, plot.COMMAND, bench.COMMAND, demo.COMMAND):
  register_command(_command)
