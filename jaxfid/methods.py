"""Every method's plug-ins, registered: import this to use them by name.

Shared layers never import a method; they look up what the methods provide
in registries (:class:`jaxfid.core.registry.Registry`), which each method
fills from its own package: ``jaxfid/<method>/plugin.py`` registers (or
imports the modules that register) everything the method offers, and says
what that is. This module imports those plug-in modules only:

* commands (:data:`jaxfid.commands.registry.COMMANDS`) and ``jaxfid index``
  types (:data:`jaxfid.commands.registry.INDEX_COMMANDS`);
* ``jaxfid eval`` evaluators (:data:`jaxfid.commands.seqio_eval.METHODS`);
* index types of :func:`jaxfid.retrieval.search.open_index`: ``"bm25"``
  (shared, built in), ``"dense"`` (the T5 dual encoder), ``"reatt"``
  (ReAtt's token index);
* ``jaxfid bench`` modes (:data:`jaxfid.commands.bench.MODES`): the
  shared ``compile`` (:mod:`jaxfid.aot`) and the methods' own;
* MODEL_DIR loaders of :func:`jaxfid.checkpoints.load.load_checkpoint`, by
  the run config's ``"method"``: ``"fid"`` (built in), ``"dual_encoder"``,
  ``"reatt"``, ``"refusion"``, ``"atlas"``.

The order below is the order of the methods' ``jaxfid index`` types in
``jaxfid index --help``. The command line imports this module; so does
``jaxfid.load_t5`` (the lazy export of :mod:`jaxfid`), which loads a
MODEL_DIR of any method.
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
