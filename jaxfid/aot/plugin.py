"""Registers ``jaxfid bench compile`` (:mod:`jaxfid.aot.command`) and the
train loop's ``COMPILED_STEP`` loader (:mod:`jaxfid.aot.executables`)."""
from __future__ import annotations

from jaxfid.aot import command, executables
from jaxfid.commands.bench import Mode, register_mode
from jaxfid.training import loop

loop.STEP_LOADERS.register("file", executables.load_step)

register_mode(Mode("compile", command.HELP, command.add_arguments,
                   command.run, "bench compile", command.READS, order=40))
