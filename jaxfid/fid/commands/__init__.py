"""FiD's commands (``predict``, ``plot``, ``demo``) and ``jaxfid bench``
modes, each module's ``COMMAND`` (``MODES``) registered by the plug-in."""
