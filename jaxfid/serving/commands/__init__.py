"""``jaxfid serve``: the command and its HTTP app (the serve extra)."""
