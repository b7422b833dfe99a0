"""One module per `jaxfid` command (see jaxfid/cli.py)."""
