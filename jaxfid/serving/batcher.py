"""Dynamic batching for ``jaxfid serve``: questions that arrive together are
read in one device batch.

One thread owns the device: it takes the oldest request, waits up to
``max_wait_ms`` for more of the same beam size (at most ``max_batch``) and
reads them padded to the smallest bucket (:func:`bucket_sizes`: 1, 4, 16,
...). Every (beam size, bucket) program is compiled before the server is
ready, and only those run: another shape is an error, never a silent
recompilation. Batches are built and read by ``jaxfid predict``'s functions,
so answers and reader scores equal ``predict --passage-scores``' on the same
passages (and the attention ``predict --attention``'s).
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import threading
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from jaxfid.reader import attention as attention_lib
from jaxfid.reader import predict as predict_lib
from jaxfid.reader.batches import eval_batches
from jaxfid.reader.examples import FidExample
from jaxfid.reader.load import LoadedReader

SCORE_MODE = "probs"  # `jaxfid predict --passage-scores`' default


def bucket_sizes(max_batch: int) -> tuple[int, ...]:
  """The padded batch sizes: powers of 4 below ``max_batch``, then
  ``max_batch`` (16 -> 1, 4, 16; 10 -> 1, 4, 10; 1 -> 1)."""
  if max_batch < 1:
    raise ValueError(f"max_batch must be at least 1, got {max_batch}")
  sizes, size = [], 1
  while size < max_batch:
    sizes.append(size)
    size *= 4
  return tuple(sizes + [max_batch])


@dataclasses.dataclass(frozen=True)
class Read:
  """What the reader made of one question."""
  answer: str
  reader_scores: list[float]  # per passage, in the reader's input order
  batch_size: int             # real questions in its device batch
  bucket: int                 # the batch's padded size
  # asked for: jaxfid.reader.attention.attention_rows' row (else None)
  attention: dict[str, Any] | None = None


@dataclasses.dataclass
class _Job:
  example: FidExample
  beam_size: int
  future: concurrent.futures.Future
  attention: bool = False


class Batcher:
  """The device thread: gathers questions into batches and reads them.

  Args:
    reader: the loaded checkpoint.
    n_context, text_maxlength, decode_maxlength: the read's shapes, as
      ``jaxfid predict``'s flags.
    beam_sizes: the beam sizes a request may ask for (each compiled).
    max_batch: the most questions of one batch.
    max_wait_ms: how long the first question of a batch waits for more.
    alpha: the beam search length penalty (``jaxfid predict``'s default).
    on_batch: called with (real questions, bucket) after each batch.
  """

  def __init__(self, reader: LoadedReader, *, n_context: int,
               text_maxlength: int, decode_maxlength: int,
               beam_sizes: Sequence[int], max_batch: int, max_wait_ms: float,
               alpha: float = 0.6,
               on_batch: Callable[[int, int], None] | None = None):
    self.reader = reader
    self.n_context, self.text_maxlength = n_context, text_maxlength
    self.decode_maxlength, self.alpha = decode_maxlength, alpha
    self.beam_sizes = tuple(sorted(set(beam_sizes)))
    self.buckets = bucket_sizes(max_batch)
    self.max_batch, self.max_wait_s = max_batch, max_wait_ms / 1000
    self.on_batch = on_batch
    self._programs: dict[tuple[int, int], tuple] = {}
    self._attention: dict[int, Any] = {}  # bucket -> compiled attention
    self._queue: collections.deque[_Job] = collections.deque()
    self._cv = threading.Condition()
    self._stop = False
    self._thread: threading.Thread | None = None

  # ------------------------------------------------------------ compiling

  def _batch(self, examples: Sequence[FidExample], bucket: int) -> tuple:
    """(real rows, host batch) of ``examples`` padded to ``bucket`` rows:
    ``encoder_input_tokens`` [bucket, n_context, text_maxlength] and
    ``passage_mask`` [bucket, n_context]."""
    (_, real, batch), = eval_batches(
        examples, self.reader.tokenizer, batch_size=bucket,
        n_context=self.n_context, text_maxlength=self.text_maxlength,
        passage_eos=self.reader.passage_eos)
    return real, batch

  def compile(self, stopped: Callable[[], bool] = lambda: False) -> int:
    """Compiles the predict and score programs of every (beam size, bucket)
    and the attention program of every bucket, before :meth:`start`;
    returns the pairs' count. ``stopped()`` ends it early."""
    probe = [FidExample(question="?")]
    scores = predict_lib.make_passage_scores_fn(self.reader.model,
                                                mode=SCORE_MODE)
    for bucket in self.buckets:
      _, batch = self._batch(probe, bucket)
      shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype),
                            batch)
      scored = scores.lower(self.reader.params, shapes).compile()
      answers = jax.ShapeDtypeStruct((bucket, self.decode_maxlength),
                                     jnp.int32)
      self._attention[bucket] = attention_lib.make_attention_fn(
          self.reader.model).lower(self.reader.params, shapes,
                                   answers).compile()
      for beam in self.beam_sizes:
        if stopped():
          return len(self._programs)
        predict = predict_lib.make_predict_fn(
            self.reader.model, max_decode_len=self.decode_maxlength,
            num_beams=beam, alpha=self.alpha)
        self._programs[(beam, bucket)] = (
            predict.lower(self.reader.params, shapes).compile(), scored)
    return len(self._programs)

  # -------------------------------------------------------------- reading

  def read(self, examples: Sequence[FidExample], beam_size: int,
           attention: Sequence[bool] | None = None) -> list[Read]:
    """Reads ``examples`` (at most ``max_batch``) in one device batch;
    ``attention[i]``: example i's :class:`Read` has the reader's attention
    (the attention program runs when one asks)."""
    bucket = next(b for b in self.buckets if b >= len(examples))
    predict, scores = self._programs[(beam_size, bucket)]
    real, host = self._batch(examples, bucket)
    batch = jax.tree.map(jnp.asarray, host)
    generated = predict(self.reader.params, batch)
    answers = predict_lib.decode_rows(self.reader.tokenizer, generated, real)
    weights = predict_lib.passage_score_rows(
        scores(self.reader.params, batch), host["passage_mask"], real)
    asked = list(attention) if attention is not None else [False] * real
    rows: list = [None] * real
    if any(asked):
      read = attention_lib.attention_rows(
          self.reader.tokenizer,
          self._attention[bucket](self.reader.params, batch, generated),
          generated, host, real)
      rows = [r if a else None for r, a in zip(read, asked)]
    if self.on_batch is not None:
      self.on_batch(real, bucket)
    return [Read(a, w, real, bucket, r)
            for a, w, r in zip(answers, weights, rows)]

  def submit(self, example: FidExample, beam_size: int,
             attention: bool = False) -> concurrent.futures.Future:
    """Queues one question (``attention``: with the reader's attention);
    the future gets its :class:`Read` (or the exception its batch
    raised)."""
    if (beam_size, self.buckets[0]) not in self._programs:
      raise ValueError(f"beam size {beam_size} was not compiled")
    future: concurrent.futures.Future = concurrent.futures.Future()
    with self._cv:
      if self._stop:
        raise RuntimeError("the batcher is stopped")
      self._queue.append(_Job(example, beam_size, future, attention))
      self._cv.notify()
    return future

  def _take(self) -> list[_Job] | None:
    """The next batch: the oldest job and, within ``max_wait_s`` of taking
    it, more of its beam size up to ``max_batch``; None once stopped."""
    with self._cv:
      while not self._queue and not self._stop:
        self._cv.wait()
      if not self._queue:
        return None
      first = self._queue.popleft()
      jobs = [first]
      deadline = time.monotonic() + self.max_wait_s
      while len(jobs) < self.max_batch:
        same = [j for j in self._queue if j.beam_size == first.beam_size]
        for job in same[:self.max_batch - len(jobs)]:
          self._queue.remove(job)
          jobs.append(job)
        left = deadline - time.monotonic()
        if len(jobs) >= self.max_batch or left <= 0 or self._stop:
          break
        self._cv.wait(left)
      return jobs

  def _loop(self) -> None:
    while (jobs := self._take()) is not None:
      live = [j for j in jobs if j.future.set_running_or_notify_cancel()]
      if not live:
        continue
      asked = [j.attention for j in live]
      try:
        reads = (self.read([j.example for j in live], live[0].beam_size,
                           attention=asked) if any(asked) else
                 self.read([j.example for j in live], live[0].beam_size))
      except Exception as e:  # pylint: disable=broad-except
        for job in live:  # each request answers 500; the thread goes on
          job.future.set_exception(e)
        continue
      for job, result in zip(live, reads):
        job.future.set_result(result)

  def start(self) -> None:
    """Starts the device thread (after :meth:`compile`)."""
    if not self._programs:
      raise RuntimeError("compile() first")
    self._thread = threading.Thread(target=self._loop, name="jaxfid-reader",
                                    daemon=True)
    self._thread.start()

  def close(self) -> None:
    """Reads what is queued, then stops the thread."""
    with self._cv:
      self._stop = True
      self._cv.notify_all()
    if self._thread is not None:
      self._thread.join()
