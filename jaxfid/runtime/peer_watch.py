"""A multi-host process that loses another one stops at once, in one line.

JAX notices a dead process only after 100 s of missed heartbeats, and ends
the others with a fatal log. :func:`start` (after
``jax.distributed.initialize``) connects each process to process 0 by TCP; a
process leaving through Python says ``bye`` first, so a socket closing
without it means the peer is gone: the other end prints one line naming it
and aborts (SIGABRT). If the sockets cannot be set up nothing is watched.
:func:`lost_peer` recognises a collective's lost-peer error.
"""
from __future__ import annotations

import atexit
import os
import re
import secrets
import socket
import sys
import threading

import jax
from jax._src import distributed as jax_distributed

_KEY = "jaxfid/peer_watch"
_BYE = b"bye"
_CONNECT_S = 60
_stopping = threading.Lock()
_leaving = threading.Event()
_sockets: list[socket.socket] = []
# what a CPU collective (gloo) says when the process at the other end is gone
_LOST_CONNECTION = re.compile(
    r"(Gloo \w+ failed: .*?(?:Connection reset by peer|Connection closed by "
    r"peer|Broken pipe|Connection refused))")


def start(command: str) -> None:
  """Watches the other processes of this multi-host run (no-op with one
  process); ``command`` names the command in the line (``jaxfid train``)."""
  if jax.process_count() == 1 or _sockets:
    return
  client = jax_distributed.global_state.client
  if jax.process_index() == 0:
    try:
      server = socket.create_server(("", 0), backlog=jax.process_count())
    except OSError:
      client.key_value_set(_KEY, "0 -")  # not watched
      return
    _sockets.append(server)
    token = secrets.token_hex(16)
    client.key_value_set(_KEY, f"{server.getsockname()[1]} {token}")
    _thread(_accept, server, token, command)
  else:
    host = jax_distributed.global_state.coordinator_address.rsplit(":", 1)[0]
    _thread(_connect, client, host.strip("[]"), command)
  atexit.register(_bye)


def _thread(target, *args) -> None:
  threading.Thread(target=target, args=args, daemon=True,
                   name="jaxfid-peer-watch").start()


def _accept(server: socket.socket, token: str, command: str) -> None:
  while True:
    try:
      conn, _ = server.accept()
    except OSError:
      return
    _thread(_introduced, conn, token, command)


def _introduced(conn: socket.socket, token: str, command: str) -> None:
  """Process 0: a connection that says the run's token and its process
  index is watched; any other is closed and ignored."""
  conn.settimeout(_CONNECT_S)
  data = b""
  try:
    while b"\n" not in data and len(data) < 100:
      chunk = conn.recv(100)
      if not chunk:
        break
      data += chunk
  except OSError:
    pass
  line, newline, rest = data.partition(b"\n")
  words = line.split()
  if (not newline or len(words) != 2 or words[0] != token.encode()
      or not words[1].isdigit()):
    conn.close()
    return
  conn.settimeout(None)
  _sockets.append(conn)
  _watch(conn, int(words[1]), command, rest)


def _connect(client, host: str, command: str) -> None:
  try:
    port, token = client.blocking_key_value_get(
        _KEY, _CONNECT_S * 1000).split()
    if port == "0":
      return
    conn = socket.create_connection((host, int(port)), timeout=_CONNECT_S)
    conn.settimeout(None)
    conn.sendall(f"{token} {jax.process_index()}\n".encode())
  except Exception:  # pylint: disable=broad-except
    return  # not watched: JAX's heartbeats still end this process
  _sockets.append(conn)
  _watch(conn, 0, command)


def _watch(conn: socket.socket, process: int, command: str,
           received: bytes = b"") -> None:
  """Reads until the socket closes; ``bye`` last: a deliberate end."""
  try:
    while chunk := conn.recv(64):
      received = (received + chunk)[-len(_BYE):]
  except OSError:
    pass
  if received != _BYE and not _leaving.is_set():
    stop(command, f"process {process} of this multi-host run is gone "
         "(killed, crashed or its host lost)")


def lost_peer(error: BaseException) -> str | None:
  """What a collective's error says when another process of this run is
  gone (its connection reset); None for any other error or one process."""
  if jax.process_count() == 1 or not isinstance(error,
                                                jax.errors.JaxRuntimeError):
    return None
  found = _LOST_CONNECTION.search(" ".join(str(error).split()))
  if found is None:
    return None
  return f"another process of this multi-host run is gone ({found.group(1)})"


def stop(command: str, what: str) -> None:
  """One line (once per process), then the end JAX gives a process whose
  peer is gone (SIGABRT), without ``jax.distributed``'s exit-time wait for
  every process, the lost one too."""
  with _stopping:  # a second caller waits for the first one's end
    sys.stdout.flush()
    print(f"jaxfid {command}: error: {what}; stopping this process too. "
          "Rerun the command on every host (a run resumes from its last "
          "checkpoint)", file=sys.stderr, flush=True)
    os.abort()


def _bye() -> None:
  """At exit through Python: tells the others this end is deliberate."""
  _leaving.set()  # a peer closing now is no news
  for conn in _sockets:
    try:
      conn.sendall(_BYE)
    except OSError:  # the listening socket, or a peer already gone
      pass


__all__ = ["lost_peer", "start", "stop"]
