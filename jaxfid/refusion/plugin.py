"""What ReFusion offers, registered by name (imported by :mod:`jaxfid.methods`).

Its task (``gin/refusion/*.gin``), its MODEL_DIR loader ``"refusion"``, its
``jaxfid eval`` evaluator ``"refusion"`` with its gin checks, and the command
``jaxfid refusion seeds``.
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
