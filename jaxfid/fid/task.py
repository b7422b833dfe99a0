"""FiD's training task (Izacard & Grave 2020): the shared reader, by name.

``gin/fid/*.gin`` bind ``METHOD = @fid_task.FidTask()``; ReAtt's and
Atlas's gin files bind it as their task's ``reader``. Everything it does is
:class:`jaxfid.reader.task.ReaderTask`'s: FiD is the reader itself. FiDO
(de Jong et al. 2022) is FiD with the T5 switches of ``gin/fid/fido_*.gin``
(``cross_attention_period``, multi-query cross-attention), started from a
dense T5 by :mod:`jaxfid.checkpoints.fido_uptrain`.
"""
from __future__ import annotations

from jaxfid.reader.task import ReaderTask


class FidTask(ReaderTask):
  """Train a FiD reader (see the module docstring)."""
  name = "fid"
