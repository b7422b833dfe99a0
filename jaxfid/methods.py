"""Every method's plug-ins, registered: import this to use them by name.

Shared layers never import a method; they look up what the methods provide
in registries (:class:`jaxfid.core.registry.Registry`):

* index types of :func:`jaxfid.retrieval.search.open_index`: ``"bm25"``,
  ``"dense"`` (the T5 dual encoder), ``"reatt"`` (ReAtt's token index);
* MODEL_DIR loaders of :func:`jaxfid.checkpoints.load.load_checkpoint`, by
  the run config's ``"method"``: ``"fid"`` (built in), ``"dual_encoder"``,
  ``"reatt"``, ``"refusion"``.

The command line imports this module; so does ``jaxfid.load_t5`` (the lazy
export of :mod:`jaxfid`), which loads a MODEL_DIR of any method.
"""
from __future__ import annotations

# pylint: disable=unused-import
import jaxfid.dual_encoder.checkpoint  # MODEL_DIR loader "dual_encoder"
import jaxfid.dual_encoder.index  # index type "dense"
import jaxfid.reatt.checkpoint  # MODEL_DIR loader "reatt"
import jaxfid.reatt.token_index  # index type "reatt"
import jaxfid.refusion.checkpoint  # MODEL_DIR loader "refusion"
import jaxfid.retrieval.bm25.index  # index type "bm25"
from jaxfid.checkpoints.load import (  # MODEL_DIR loader "fid"
    METHOD_LOADERS, load_checkpoint, load_t5)
from jaxfid.retrieval.search import INDEX_TYPES, open_index

__all__ = ["INDEX_TYPES", "METHOD_LOADERS", "load_checkpoint", "load_t5",
           "open_index"]
