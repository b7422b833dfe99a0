"""What FiD offers, registered by name (:mod:`jaxfid.methods` imports it):
its task (``gin/fid/*.gin``), MODEL_DIR loader ``"fid"`` (built into
:mod:`jaxfid.checkpoints.load`), ``jaxfid eval`` evaluator ``"fid"`` (also
the default of checkpoints without a run config), the commands ``predict``,
``plot`` and ``demo``, and the ``jaxfid bench`` modes ``train``, ``decode``
and ``memory``.
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
