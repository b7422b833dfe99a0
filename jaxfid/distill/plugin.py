"""What FiD-KD (Izacard & Grave 2021) offers, registered by name.

:mod:`jaxfid.methods` imports this module. FiD-KD distils a trained
reader's cross-attention into the dual encoder: ``jaxfid predict
--scored-data`` writes the reader's passage scores
(:mod:`jaxfid.distill.scored_data`), the dual encoder's ``distill``
objective trains on them (:mod:`jaxfid.dual_encoder.distill_data`,
:mod:`jaxfid.dual_encoder.distill_loss`), and ``jaxfid distill iterate``
(:mod:`jaxfid.distill.commands`, :mod:`jaxfid.distill.iterate`) runs the
rounds: reader, scores, retriever, index, retrieval.
"""
from __future__ import annotations

from jaxfid.commands.registry import register_command
from jaxfid.distill import commands

register_command(commands.COMMAND)
