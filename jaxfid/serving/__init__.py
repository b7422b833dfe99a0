"""``jaxfid serve``'s parts that know no web framework (batcher, service,
metrics, page); the routes and server are in :mod:`.commands`."""
