"""FiD-KD (Izacard & Grave 2021), registered by name: ``jaxfid predict
--scored-data`` writes the reader's passage scores, the dual encoder's
``distill`` objective trains on them, ``jaxfid distill iterate`` runs the
rounds.
"""
from __future__ import annotations

from jaxfid.commands.registry import register_command
from jaxfid.distill import commands

register_command(commands.COMMAND)
