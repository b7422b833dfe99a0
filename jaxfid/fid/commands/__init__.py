"""FiD's commands: ``jaxfid predict``, ``plot``, ``bench`` and ``demo``.

Each module defines its :class:`~jaxfid.commands.registry.Command` as
``COMMAND``; :mod:`jaxfid.fid.plugin` registers them.
"""
