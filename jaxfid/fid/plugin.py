"""What FiD offers, registered by name.

:mod:`jaxfid.methods` imports this module (as it imports every method's
``plugin``); nothing else needs to. FiD offers

* its task, ``METHOD = @fid_task.FidTask()`` (``gin/fid/*.gin``; gin imports
  :mod:`jaxfid.fid.task` when it reads the file);
* its MODEL_DIR loader ``"fid"``: the plain encoder-decoder one, built into
  :mod:`jaxfid.checkpoints.load` (what every T5 checkpoint without a run
  config loads as too);
* its ``jaxfid eval`` evaluator ``"fid"``
  (:class:`~jaxfid.reader.checkpoint_eval.FidCheckpointEvaluator`; also the
  evaluator of checkpoints without a run config,
  :data:`jaxfid.commands.seqio_eval.DEFAULT_METHOD`), whose decoding
  settings are one :class:`~jaxfid.reader.config.DecodeConfig`;
* its commands ``jaxfid predict``, ``plot`` and ``demo``
  (:mod:`jaxfid.fid.commands`);
* its modes of the shared ``jaxfid bench``: ``train``, ``decode`` and
  ``memory`` (:mod:`jaxfid.fid.commands.bench`), read as gin command
  ``bench``.
"""
from __future__ import annotations

from jaxfid.commands import bench as shared_bench
from jaxfid.commands import seqio_eval
from jaxfid.commands.gin_specs import TABLE
from jaxfid.commands.registry import register_command
from jaxfid.core.gin_checks import text
from jaxfid.fid.commands import bench, demo, plot, predict
from jaxfid.reader.checkpoint_eval import FidCheckpointEvaluator
from jaxfid.t5.config import DTYPES

METHOD = "fid"

seqio_eval.METHODS.register(METHOD, FidCheckpointEvaluator)
TABLE.add(FidCheckpointEvaluator, dtype=text(DTYPES, optional=True))
for _command in (predict.COMMAND, plot.COMMAND, demo.COMMAND):
  register_command(_command)
for _mode in bench.MODES:
  shared_bench.register_mode(_mode)
