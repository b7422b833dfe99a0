"""ReAtt ``MODEL_DIR``s load through :func:`jaxfid.checkpoints.load.load_checkpoint`.

Importing this module registers :func:`jaxfid.reatt.model.load_reatt` as the
loader of runs whose ``jaxfid_config.json`` says ``"method": "reatt"`` (the
ReAtt model: FiD plus the retrieval head).
"""
from __future__ import annotations

from jaxfid.checkpoints.load import METHOD_LOADERS
from jaxfid.reatt.model import load_reatt

METHOD = "reatt"

METHOD_LOADERS.register(METHOD, load_reatt)
