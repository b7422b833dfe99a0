"""``python -m jaxfid ...`` is the ``jaxfid`` command."""
import sys

from jaxfid.cli import main

if __name__ == "__main__":
  sys.exit(main())
