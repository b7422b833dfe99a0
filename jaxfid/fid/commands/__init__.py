"""FiD's commands: ``jaxfid predict``, ``plot`` and ``demo``, and its modes
of ``jaxfid bench``.

Each command module defines its :class:`~jaxfid.commands.registry.Command`
as ``COMMAND``, ``bench`` its :class:`~jaxfid.commands.bench.Mode`s as
``MODES``; :mod:`jaxfid.fid.plugin` registers them.
"""
