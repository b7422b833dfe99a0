"""Every method's plug-ins, registered: import this to use them by name.

Shared layers never import a method; each ``jaxfid/<method>/plugin.py``
fills the registries (commands, ``jaxfid index`` types, ``jaxfid eval``
evaluators, index types of :func:`jaxfid.retrieval.search.open_index`,
``jaxfid bench`` modes, MODEL_DIR loaders) with what its method offers. The
order below is that of ``jaxfid index --help``. The command line and
``jaxfid.load_t5`` import this module.
"""
from __future__ import annotations

# pylint: disable=unused-import
import jaxfid.aot.plugin  # noqa: F401 (jaxfid bench compile)
import jaxfid.atlas.plugin  # noqa: F401
from jaxfid.checkpoints.load import METHOD_LOADERS, load_checkpoint, load_t5
import jaxfid.distill.plugin  # noqa: F401
import jaxfid.dual_encoder.plugin  # noqa: F401
import jaxfid.fid.plugin  # noqa: F401
import jaxfid.reatt.plugin  # noqa: F401
import jaxfid.refusion.plugin  # noqa: F401
import jaxfid.retrieval.bm25.index  # noqa: F401 (index type "bm25", built in)
from jaxfid.retrieval.search import INDEX_TYPES, open_index
import jaxfid.serving.plugin  # noqa: F401

__all__ = ["INDEX_TYPES", "METHOD_LOADERS", "load_checkpoint", "load_t5",
           "open_index"]
