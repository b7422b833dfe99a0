"""ReFusion (Wu et al., ICLR 2024): retrieval representation fusion on T5.

Modules wrapping chosen T5 projections fuse retrieved sentence vectors into
the hidden states; a bi-level search picks per module between the original
projection, the reranker and the ordered mask. See :mod:`.fusion`,
:mod:`.model`, :mod:`.task` and :mod:`.search`.
"""
