"""``jaxfid serve`` registered by name (:mod:`jaxfid.methods` imports it)."""
from __future__ import annotations

from jaxfid.commands.registry import register_command
from jaxfid.serving.commands import serve

register_command(serve.COMMAND)
