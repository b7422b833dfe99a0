"""``GET /metrics`` of ``jaxfid serve``: Prometheus text exposition (0.0.4).

* ``jaxfid_serve_requests_total{endpoint, status}``: answered requests;
* ``jaxfid_serve_errors_total{endpoint, status}``: those answered 4xx / 5xx;
* ``jaxfid_serve_request_seconds{endpoint}``: a latency histogram;
* ``jaxfid_serve_batch_size``: a histogram of the questions of each device
  batch (buckets: the compiled batch sizes), and
  ``jaxfid_serve_batches_total{bucket}``: batches by their padded size;
* ``jaxfid_serve_ready``: 1 once the programs are compiled, else 0.

Updated from the event loop and the device thread alike, under one lock.
"""
from __future__ import annotations

import bisect
import collections
import threading
from typing import Sequence

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                     10.0)


class Histogram:
  """Cumulative buckets, a sum and a count, as Prometheus histograms."""

  def __init__(self, bounds: Sequence[float]):
    self.bounds = tuple(bounds)
    self.counts = [0] * (len(self.bounds) + 1)  # the last: +Inf only
    self.sum = 0.0

  def observe(self, value: float) -> None:
    self.counts[bisect.bisect_left(self.bounds, value)] += 1
    self.sum += value

  def lines(self, name: str, labels: str = "") -> list[str]:
    sep = "," if labels else ""
    out, total = [], 0
    for bound, count in zip(self.bounds + (float("inf"),), self.counts):
      total += count
      le = "+Inf" if bound == float("inf") else _number(bound)
      out.append(f'{name}_bucket{{{labels}{sep}le="{le}"}} {total}')
    braces = f"{{{labels}}}" if labels else ""
    out += [f"{name}_sum{braces} {_number(self.sum)}",
            f"{name}_count{braces} {total}"]
    return out


def _number(value: float) -> str:
  return repr(float(value)) if value != int(value) else str(int(value))


class Metrics:
  """The server's counters and histograms; :meth:`text` renders them."""

  def __init__(self, batch_buckets: Sequence[int]):
    self._lock = threading.Lock()
    self._requests: collections.Counter = collections.Counter()
    self._latency: dict[str, Histogram] = {}
    self._batch_size = Histogram(batch_buckets)
    self._batches: collections.Counter = collections.Counter()
    self._in_flight = 0
    self.ready = False

  def in_flight(self, change: int) -> None:
    """+1 once a question request's headers are in, -1 once it is over."""
    with self._lock:
      self._in_flight += change

  def request(self, endpoint: str, status: int, seconds: float) -> None:
    with self._lock:
      self._requests[(endpoint, status)] += 1
      self._latency.setdefault(endpoint, Histogram(LATENCY_BUCKETS_S)
                               ).observe(seconds)

  def batch(self, size: int, bucket: int) -> None:
    with self._lock:
      self._batch_size.observe(size)
      self._batches[bucket] += 1

  def text(self) -> str:
    with self._lock:
      out = ["# HELP jaxfid_serve_ready 1 once the programs are compiled.",
             "# TYPE jaxfid_serve_ready gauge",
             f"jaxfid_serve_ready {int(self.ready)}",
             "# HELP jaxfid_serve_requests_in_flight Question requests "
             "received and not yet answered.",
             "# TYPE jaxfid_serve_requests_in_flight gauge",
             f"jaxfid_serve_requests_in_flight {self._in_flight}",
             "# HELP jaxfid_serve_requests_total Requests answered.",
             "# TYPE jaxfid_serve_requests_total counter"]
      for (endpoint, status), n in sorted(self._requests.items()):
        out.append(f'jaxfid_serve_requests_total{{endpoint="{endpoint}",'
                   f'status="{status}"}} {n}')
      out += ["# HELP jaxfid_serve_errors_total Requests answered 4xx or "
              "5xx.", "# TYPE jaxfid_serve_errors_total counter"]
      for (endpoint, status), n in sorted(self._requests.items()):
        if status >= 400:
          out.append(f'jaxfid_serve_errors_total{{endpoint="{endpoint}",'
                     f'status="{status}"}} {n}')
      out += ["# HELP jaxfid_serve_request_seconds Request latency.",
              "# TYPE jaxfid_serve_request_seconds histogram"]
      for endpoint, hist in sorted(self._latency.items()):
        out += hist.lines("jaxfid_serve_request_seconds",
                          f'endpoint="{endpoint}"')
      out += ["# HELP jaxfid_serve_batch_size Questions per device batch.",
              "# TYPE jaxfid_serve_batch_size histogram"]
      out += self._batch_size.lines("jaxfid_serve_batch_size")
      out += ["# HELP jaxfid_serve_batches_total Device batches by padded "
              "size.", "# TYPE jaxfid_serve_batches_total counter"]
      for bucket, n in sorted(self._batches.items()):
        out.append(f'jaxfid_serve_batches_total{{bucket="{bucket}"}} {n}')
      return "\n".join(out) + "\n"
