"""``jaxfid serve``'s HTTP routes: a Starlette application over a
:class:`ServerState`.

* ``GET /``, ``GET /static/{page.css,page.js}``: the page;
* ``GET /v1/info``: the checkpoint, the index, a request's limits, example
  titles, ``"ready"``;
* ``GET /healthz``: 200 ``{"status": "ready"}`` once compiled, else 503
  ``{"status": "loading"}``;
* ``GET /metrics``: Prometheus text (:mod:`jaxfid.serving.metrics`);
* ``POST /v1/answer`` ``{"question", "n_context"?, "beam_size"?}``, ``POST
  /v1/answer:batch`` ``{"questions": [...], ...}`` -> ``{"answers": [...]}``.

Every error is JSON ``{"error": "..."}``: 4xx for a bad request, 503 while
loading, 500 (and one log line) for a failure inside; serving goes on.
Starlette is imported in :func:`build_app` only.
"""
from __future__ import annotations

import dataclasses
import logging
import time

from jaxfid.serving import page
from jaxfid.serving.metrics import Metrics
from jaxfid.serving.service import MAX_BODY_BYTES, QaService, RequestError

LOG = logging.getLogger("jaxfid.serve")
ANSWER, BATCH = "/v1/answer", "/v1/answer:batch"


@dataclasses.dataclass
class ServerState:
  """What the routes serve: the service once loaded (None before), the
  metrics and what ``GET /v1/info`` says."""
  metrics: Metrics
  service: QaService | None = None
  info: dict = dataclasses.field(default_factory=dict)


def one_line(error: BaseException) -> str:
  """``Type: message`` on one line (for the log)."""
  return " ".join(f"{type(error).__name__}: {error}".split())


def build_app(state: ServerState):
  """The ASGI application of ``state`` (Starlette's, guarded)."""
  # pylint: disable=import-outside-toplevel
  from starlette.applications import Starlette
  from starlette.exceptions import HTTPException
  from starlette.responses import JSONResponse, Response
  from starlette.routing import Route

  async def body_of(request) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
      raise RequestError(413, f"the body has {declared} bytes; at most "
                         f"{MAX_BODY_BYTES}")
    chunks, size = [], 0
    async for chunk in request.stream():
      size += len(chunk)
      if size > MAX_BODY_BYTES:
        raise RequestError(413, f"the body has more than {MAX_BODY_BYTES} "
                           "bytes")
      chunks.append(chunk)
    return b"".join(chunks)

  async def answered(request, batch: bool) -> tuple[int, dict]:
    service = state.service
    if service is None:
      return 503, {"error": "loading: the server is not ready yet"}
    try:
      parsed = service.parse(await body_of(request), batch)
      answers = await service.answer(parsed)
    except RequestError as e:
      return e.status, {"error": e.message}
    except Exception as e:  # pylint: disable=broad-except
      LOG.error("POST %s failed: %s", request.url.path, one_line(e))
      return 500, {"error": f"internal error ({type(e).__name__}); the "
                   "server log has the details"}
    return 200, ({"answers": answers} if batch else answers[0])

  def route(endpoint: str, batch: bool):
    async def handle(request):
      start = time.perf_counter()
      state.metrics.in_flight(+1)
      try:
        status, content = await answered(request, batch)
      finally:
        state.metrics.in_flight(-1)
      state.metrics.request(endpoint, status, time.perf_counter() - start)
      return JSONResponse(content, status_code=status)
    return handle

  async def healthz(request):
    del request
    if state.service is None:
      return JSONResponse({"status": "loading"}, status_code=503)
    return JSONResponse({"status": "ready"})

  async def info(request):
    del request
    return JSONResponse({**state.info, "ready": state.service is not None})

  async def metrics(request):
    del request
    return Response(state.metrics.text(),
                    media_type="text/plain; version=0.0.4; charset=utf-8")

  def static(name: str):
    async def handle(request):
      del request
      content, content_type = page.read(name)
      return Response(content, media_type=content_type,
                      headers={"cache-control": "no-cache"})
    return handle

  async def http_error(request, error):
    state.metrics.request("other", error.status_code, 0.0)
    what = (f"no {request.url.path}" if error.status_code == 404
            else f"{request.method} {request.url.path}: {error.detail}")
    return JSONResponse({"error": what}, status_code=error.status_code,
                        headers=getattr(error, "headers", None))

  async def internal_error(request, error):
    del request  # `guarded` logs the error: Starlette raises it again
    return JSONResponse({"error": f"internal error ({type(error).__name__})"},
                        status_code=500)

  routes = [Route("/", static("index.html")),
            Route("/static/page.css", static("page.css")),
            Route("/static/page.js", static("page.js")),
            Route("/healthz", healthz), Route("/metrics", metrics),
            Route("/v1/info", info),
            Route(ANSWER, route(ANSWER, False), methods=["POST"]),
            Route(BATCH, route(BATCH, True), methods=["POST"])]
  app = Starlette(routes=routes, exception_handlers={
      HTTPException: http_error, Exception: internal_error})

  async def guarded(scope, receive, send):
    """The app; an error that escaped a route (answered 500 JSON by
    ``internal_error``, then raised again by Starlette for the server to
    log) is logged here as one line instead of uvicorn's traceback."""
    try:
      await app(scope, receive, send)
    except Exception as e:  # pylint: disable=broad-except
      LOG.error("%s %s failed: %s", scope.get("method", ""),
                scope.get("path", ""), one_line(e))
  return guarded
