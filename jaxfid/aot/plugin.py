"""Registers ``jaxfid bench compile`` (:mod:`jaxfid.aot.command`)."""
from __future__ import annotations

from jaxfid.aot import command
from jaxfid.commands.bench import Mode, register_mode

register_mode(Mode("compile", command.HELP, command.add_arguments,
                   command.run, "bench compile", command.READS, order=40))
