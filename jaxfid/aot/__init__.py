"""Sizing a run for accelerators it is not running on: ahead-of-time compiles.

``jaxfid bench compile`` (:mod:`jaxfid.aot.command`) builds a run's task from
its gin files and compiles its train step or decoding from shapes alone for a
target it need not have: :mod:`~jaxfid.aot.topologies` (the targets and
their chips' figures), :mod:`~jaxfid.aot.programs` (what is compiled, and
the report read from the executable), :mod:`~jaxfid.aot.search` (remat,
mesh splits, accumulation and scan tried side by side),
:mod:`~jaxfid.aot.search_log` (a resumable search) and
:mod:`~jaxfid.aot.breakdown` (where a compiled step's bytes and FLOPs go). :mod:`~jaxfid.aot.plugin`
registers the ``compile`` mode of ``jaxfid bench``.
"""
