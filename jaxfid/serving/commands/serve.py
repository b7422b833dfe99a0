"""``jaxfid serve``: open-domain QA over HTTP, with a page.

  jaxfid serve --checkpoint MODEL_DIR_OR_HF_DIR --index INDEX_DIR
      [--host 127.0.0.1] [--port 8000] [--n-context N]
      [--text-maxlength L] [--decode-maxlength T] [--beam-size K]
      [--length-penalty A] [--max-batch 16] [--max-wait-ms 10]

The decoding flags are :class:`~jaxfid.reader.config.DecodeConfig`'s fields,
defaulting to the checkpoint's run config. One process owns the devices: it
opens the index (any ``jaxfid retrieve`` opens), starts uvicorn, then loads
the checkpoint and compiles every batch bucket and beam size in the
background (``/healthz`` 503 meanwhile) and prints the URL. SIGTERM or
Ctrl-C finishes the requests in flight and exits 0. A request may ask for
fewer passages than ``--n-context`` (padded) and any beam size up to
``--beam-size``.
"""
from __future__ import annotations

import dataclasses
import logging
import signal
import socket
import sys
import threading
import time

from jaxfid.commands import shell
from jaxfid.commands.registry import Command
from jaxfid.core import paths
from jaxfid.core.errors import InputError
from jaxfid.reader import config as config_lib
from jaxfid.reader.load import add_decode_flags, decode_config, load_reader
from jaxfid.retrieval.index_dir import read_meta
from jaxfid.retrieval.search import Searcher, open_index
from jaxfid.serving.batcher import Batcher, bucket_sizes
from jaxfid.serving.commands.serve_app import ServerState, build_app
from jaxfid.serving.metrics import Metrics
from jaxfid.serving.service import QaService, example_titles

LOG = logging.getLogger("jaxfid.serve")
# The serve extra (setup.py): without it, one line says how to install it.
SERVE_STACK = ("uvicorn", "starlette")


# DecodeConfig fields serve does not use (its batches are --max-batch)
SKIPPED = ("target_maxlength", "batch_size")


@dataclasses.dataclass(frozen=True)
class ServeConfig:
  """``jaxfid serve``'s flags, checked once (the decoding ones by
  ``decode``)."""
  checkpoint: str
  index: str
  host: str = "127.0.0.1"
  port: int = 8000
  decode: config_lib.DecodeConfig = dataclasses.field(
      default_factory=lambda: config_lib.DecodeConfig())
  max_batch: int = 16
  max_wait_ms: float = 10.0

  def __post_init__(self):
    if self.max_batch < 1:
      raise InputError("--max-batch", "must be at least 1")
    if not 0 <= self.port <= 65535:
      raise InputError("--port", "must be between 0 and 65535 (0: any free "
                       "port)")
    if not 0 <= self.max_wait_ms <= 60_000:
      raise InputError("--max-wait-ms", "must be between 0 and 60000")
    if not paths.exists(self.checkpoint):
      raise InputError(self.checkpoint, "no such checkpoint")

  @property
  def n_context(self) -> int:
    return self.decode.n_context

  @property
  def text_maxlength(self) -> int:
    return self.decode.text_maxlength

  @property
  def decode_maxlength(self) -> int:
    return self.decode.decode_length

  @property
  def beam_size(self) -> int:
    return self.decode.num_beams

  @property
  def beam_sizes(self) -> tuple[int, ...]:
    return tuple(range(1, self.beam_size + 1))


def add_parser(subparsers) -> None:
  p = subparsers.add_parser(
      "serve", help="answer questions over HTTP (API and page) with a "
      "checkpoint and an index",
      description="Serve open-domain QA: retrieve from INDEX_DIR, read with "
      "the checkpoint; POST /v1/answer, POST /v1/answer:batch, GET /healthz, "
      "GET /metrics, GET /v1/info and a page at GET /.")
  p.add_argument("--checkpoint", required=True,
                 help="a MODEL_DIR, HF T5 directory, original-FiD reader or "
                 "T5X checkpoint (as jaxfid predict)")
  p.add_argument("--index", required=True, help="index directory (as "
                 "jaxfid retrieve)")
  p.add_argument("--host", default="127.0.0.1")
  p.add_argument("--port", type=int, default=8000, help="0: any free port")
  add_decode_flags(p, skip=SKIPPED)
  p.add_argument("--max-batch", type=int, default=16,
                 help="the most questions of one device batch")
  p.add_argument("--max-wait-ms", type=float, default=10.0,
                 help="how long a question waits for others to batch with")
  p.set_defaults(func=run)


def serve_config(args) -> ServeConfig:
  """The ServeConfig of the parsed flags (decoding: :func:`~jaxfid.fid.
  reader.decode_config`)."""
  return ServeConfig(
      checkpoint=args.checkpoint, index=args.index, host=args.host,
      port=args.port, decode=decode_config(args),
      max_batch=args.max_batch, max_wait_ms=args.max_wait_ms)


def server_info(config: ServeConfig, searcher: Searcher) -> dict:
  """What ``GET /v1/info`` says: the checkpoint and index as given, the
  index's type and size, the request limits and defaults, the lengths read
  and a few titles of the index's passages (the page's examples)."""
  return {"checkpoint": config.checkpoint, "index": config.index,
          "index_type": read_meta(config.index)["type"],
          "passages_in_index": len(searcher.store),
          "n_context": config.n_context, "beam_size": config.beam_size,
          "text_maxlength": config.text_maxlength,
          "decode_maxlength": config.decode_maxlength,
          "max_batch": config.max_batch,
          "example_titles": example_titles(searcher.store)}


def _url(host: str, port: int) -> str:
  return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def _bind(host: str, port: int) -> socket.socket:
  """The listening socket (bound here so that ``--port 0`` can name its
  port in the ready line)."""
  try:
    info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                              flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(info[0], socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(info[4])
  except OSError as e:
    raise InputError("--host/--port", f"cannot listen on {host}:{port}: "
                     f"{e.strerror or e}") from None
  sock.listen(2048)
  return sock


class _Loader:
  """Loads the checkpoint and compiles in a thread while the server runs;
  then makes the state ready and prints the ready line."""

  def __init__(self, config: ServeConfig, searcher, state: ServerState,
               server, url: str):
    self.config, self.searcher, self.state = config, searcher, state
    self.server, self.url = server, url
    self.error: BaseException | None = None
    self.batcher: Batcher | None = None
    self.thread = threading.Thread(target=self._run, name="jaxfid-load",
                                   daemon=True)

  def _run(self) -> None:
    try:
      self._load()
    except BaseException as e:  # pylint: disable=broad-except
      self.error = e  # run() reports it once the server has stopped
      self.server.should_exit = True

  def _stopped(self) -> bool:
    return self.server.should_exit

  def _load(self) -> None:
    c = self.config
    reader = load_reader(c.checkpoint)
    if self._stopped():
      return
    self.batcher = Batcher(
        reader, n_context=c.n_context, text_maxlength=c.text_maxlength,
        decode_maxlength=c.decode_maxlength, beam_sizes=c.beam_sizes,
        alpha=c.decode.alpha,
        max_batch=c.max_batch, max_wait_ms=c.max_wait_ms,
        on_batch=self.state.metrics.batch)
    # the server is up (and takes SIGTERM/SIGINT) before this line
    while not self.server.started and not self._stopped():
      time.sleep(0.01)
    if self._stopped():
      return
    print(f"compiling the reader for batch sizes {self.batcher.buckets} and "
          f"beam sizes {self.batcher.beam_sizes}", file=sys.stderr,
          flush=True)
    start = time.perf_counter()
    count = self.batcher.compile(stopped=self._stopped)
    if self._stopped():  # stopped while loading: nothing to serve
      return
    self.batcher.start()
    self.state.service = QaService(self.searcher, self.batcher,
                                   n_context=c.n_context,
                                   beam_size=c.beam_size)
    self.state.metrics.ready = True
    print(f"compiled {count} programs in {time.perf_counter() - start:.1f} s",
          file=sys.stderr, flush=True)
    print(f"jaxfid serve: ready at {self.url}", flush=True)


def run(args) -> int:
  shell.require_extra("serve", SERVE_STACK, "jaxfid serve")
  config = serve_config(args)
  import uvicorn  # pylint: disable=import-outside-toplevel
  searcher = open_index(config.index)
  handler = logging.StreamHandler(sys.stderr)
  handler.setFormatter(logging.Formatter("jaxfid serve: %(message)s"))
  LOG.addHandler(handler)
  LOG.propagate = False
  state = ServerState(Metrics(bucket_sizes(config.max_batch)),
                      info=server_info(config, searcher))
  sock = _bind(config.host, config.port)
  url = _url(config.host, sock.getsockname()[1])
  server = uvicorn.Server(uvicorn.Config(
      build_app(state), log_level="warning", access_log=False,
      lifespan="off", timeout_graceful_shutdown=None))
  loader = _Loader(config, searcher, state, server, url)
  print(f"jaxfid serve: listening on {url}, loading {config.checkpoint} "
        "(GET /healthz answers 503 until ready)", file=sys.stderr, flush=True)
  # uvicorn takes SIGTERM/SIGINT while it runs, shuts down gracefully, then
  # raises the signal again for the handler it found: a no-op one here, so
  # that a stop by signal is a clean exit 0.
  previous = {s: signal.signal(s, lambda *_: None)
              for s in (signal.SIGTERM, signal.SIGINT)}
  loader.thread.start()
  try:
    server.run(sockets=[sock])
  finally:
    server.should_exit = True  # a loader still at work stops soon
    loader.thread.join()  # (after the checkpoint or program at hand)
    for s, h in previous.items():
      signal.signal(s, h)
    sock.close()
    if loader.batcher is not None:
      loader.batcher.close()
    if state.service is not None:
      state.service.close()
    LOG.removeHandler(handler)
  if loader.error is not None:
    raise loader.error
  print("jaxfid serve: stopped", file=sys.stderr)
  return 0


COMMAND = Command("serve", add_parser, order=115, model=True)
