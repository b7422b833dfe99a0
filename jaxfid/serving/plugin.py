"""What the reader's HTTP server offers, registered by name.

:mod:`jaxfid.methods` imports this module. ``jaxfid serve``
(:mod:`jaxfid.serving.commands.serve`) answers questions over HTTP with any
reader checkpoint, with a page: retrieval, batching of concurrent requests
(:mod:`jaxfid.serving.batcher`), the answer service and its metrics.
"""
from __future__ import annotations

from jaxfid.commands.registry import register_command
from jaxfid.serving.commands import serve

register_command(serve.COMMAND)
