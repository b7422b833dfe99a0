"""``jaxfid serve``'s parts that know no web framework: the dynamic batcher
(:mod:`.batcher`), the QA service and its request checks (:mod:`.service`),
the Prometheus metrics (:mod:`.metrics`) and the page (:mod:`.page`, files in
``static/``). The HTTP routes and the server are in
:mod:`jaxfid.serving.commands.serve_app` and :mod:`jaxfid.serving.commands.serve`."""
