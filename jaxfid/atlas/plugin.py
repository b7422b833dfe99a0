"""What Atlas offers, registered by name.

:mod:`jaxfid.methods` imports this module (as it imports every method's
``plugin``); nothing else needs to. Atlas offers

* its task, ``METHOD = @atlas_task.AtlasTask()`` (``gin/atlas/tiny.gin``;
  gin imports :mod:`jaxfid.atlas.task` when it reads the file);
* its MODEL_DIR loader ``"atlas"`` (:func:`jaxfid.atlas.checkpoint.
  load_atlas_reader`, registered by :mod:`jaxfid.atlas.checkpoint`): an
  Atlas run loads as its FiD reader;
* its ``jaxfid eval`` evaluator ``"atlas"``: FiD's
  (:class:`~jaxfid.reader.checkpoint_eval.FidCheckpointEvaluator`, on the
  passages of the evaluation data);
* its index type ``"atlas"`` for ``jaxfid retrieve [--device]`` (a saved
  in-loop index, :mod:`jaxfid.atlas.index_search`, registered by that
  module).
"""
from __future__ import annotations

from jaxfid.atlas import checkpoint, index_search  # noqa: F401 (registers)
from jaxfid.commands import seqio_eval
from jaxfid.reader.checkpoint_eval import FidCheckpointEvaluator

METHOD = checkpoint.METHOD

seqio_eval.METHODS.register(METHOD, FidCheckpointEvaluator)
