"""ReFusion (Wu et al., ICLR 2024): retrieval representation fusion on T5.

Retrieved sentence representations are fused into the hidden states through
modules that wrap chosen projections of the T5 network; an adaptive
retrieval integrator picks, per module, between the original projection,
the reranker fusion and the ordered-mask fusion by a bi-level (DARTS-style)
search. Pieces:

* :mod:`jaxfid.refusion.fusion` — fusion formulas and the wrapping module;
* :mod:`jaxfid.refusion.model` — the T5 with fusion, rank classification;
* :mod:`jaxfid.refusion.lmbff` — the 15 few-shot tasks (LM-BFF files,
  templates, label words); :mod:`jaxfid.evaluation.classification`;
* :mod:`jaxfid.refusion.neighbours` — offline retrieval with a cache;
* :mod:`jaxfid.refusion.batches` — example arrays and deterministic batches;
  :mod:`jaxfid.refusion.data` — a run's splits, neighbours and arrays;
* :mod:`jaxfid.refusion.search` — the bi-level search step and structure;
* :mod:`jaxfid.refusion.scoring` — rank classification of a split, FLOPs;
* :mod:`jaxfid.refusion.task` — the training task the one loop runs
  (``gin/refusion/``);
* :mod:`jaxfid.refusion.checkpoint` — a trained run loaded back;
  :mod:`jaxfid.refusion.checkpoint_eval` — its ``jaxfid eval`` evaluator;
* :mod:`jaxfid.refusion.commands` — ``jaxfid refusion seeds``;
  :mod:`jaxfid.refusion.plugin` registers what ReFusion offers.
"""
