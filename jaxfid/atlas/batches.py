"""Atlas's training batches: the questions of a step with the passages the
in-loop index retrieved for them.

Letters: B questions, K passages (RETRIEVER_N_CONTEXT, by default
N_CONTEXT), L reader tokens per passage, P retriever tokens per passage, Q
per question, T target tokens.

* Questions: :func:`jaxfid.training.sampling.stream_indices` (epochs of
  ``permutation(seed, e)``), as FiD's batches: the questions of step ``s``
  are a pure function of (seed, s).
* Passages: the ``K`` best of the index for each question, searched with
  the query tower of the parameters the step starts from (Atlas retrieves
  in ``forward`` with the current retriever). The hits are a function of
  (seed, s, the parameters, the index), so a resumed run that restores the
  parameters and the index retrieves the same passages.
* Targets: a random answer per step and question from ``rng(seed, s, i)``
  (FiD's batches' draw, :func:`jaxfid.reader.inputs.choose_target`), as
  PROMPT_FORMAT writes it (:func:`jaxfid.atlas.prompts.target`: 'atlas'
  "<extra_id_0> A"), EOS-terminated.
* Rows: the reader's rows of PROMPT_FORMAT ('atlas': "question: Q answer:
  <extra_id_0> title: T context: P", :mod:`jaxfid.atlas.prompts`;
  :func:`jaxfid.reader.inputs.encode_examples`, in retrieved order) and the
  retriever's tokens of the same passages.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from jaxfid.atlas import prompts
from jaxfid.core.tokenization import Tokenizer
from jaxfid.reader import inputs as fid_inputs
from jaxfid.reader.examples import FidExample, Passage
from jaxfid.retrieval.store.corpus import Passage as CorpusPassage
from jaxfid.training.sampling import stream_indices


def with_retrieved(example: FidExample, passages: Sequence[CorpusPassage],
                   ids: Sequence[int], scores: Sequence[float]) -> FidExample:
  """``example`` whose ctxs are the corpus passages ``ids``, best first."""
  ctxs = tuple(Passage(title=passages[i].title, text=passages[i].text,
                       score=float(s), id=passages[i].id)
               for i, s in zip(ids, scores))
  return dataclasses.replace(example, ctxs=ctxs)


@dataclasses.dataclass
class AtlasBatcher:
  """Host batches of retrieved passages (module docstring)."""
  examples: list[FidExample]
  passages: list[CorpusPassage]
  passage_tokens: np.ndarray   # [N, P], the retriever's corpus tokens
  query_tokens: np.ndarray     # [E, Q], the training questions' tokens
  tokenizer: Tokenizer
  batch_size: int
  n_context: int
  text_maxlength: int
  target_maxlength: int
  seed: int = 0
  dataset: str = "nq"
  passage_eos: bool = True
  prompt_format: str = "atlas"

  def indices(self, step: int) -> np.ndarray:
    """The examples of the global batch of 0-based ``step``, [B]."""
    return stream_indices(len(self.examples), self.seed,
                          step * self.batch_size, self.batch_size)

  def batch(self, step: int, rows: slice, ids: np.ndarray,
            scores: np.ndarray) -> dict[str, np.ndarray]:
    """Rows ``rows`` of step ``step``'s batch; ``ids``/``scores`` [B, K] the
    hits of the whole batch's questions."""
    offset = rows.start or 0
    chosen = self.indices(step)[rows]
    examples, targets = [], []
    for j, i in enumerate(chosen):
      example = self.examples[int(i)]
      examples.append(prompts.reader_example(with_retrieved(
          example, self.passages, ids[offset + j], scores[offset + j]),
          self.prompt_format))
      rng = np.random.default_rng([self.seed, step, offset + j])
      text = prompts.target(fid_inputs.choose_target(example, rng,
                                                     self.dataset),
                            self.prompt_format)
      targets.append(fid_inputs.encode_target(self.tokenizer, text,
                                              self.target_maxlength))
    tokens, mask = fid_inputs.encode_examples(
        self.tokenizer, examples, self.n_context, self.text_maxlength,
        self.passage_eos)
    hits = ids[rows]                                               # [b, K]
    return {"encoder_input_tokens": tokens.astype(np.int32),       # [b, K, L]
            "passage_mask": mask,                                   # [b, K]
            "decoder_target_tokens": np.stack(targets).astype(np.int32),
            "query_tokens": self.query_tokens[chosen].astype(np.int32),
            "passage_tokens": self.passage_tokens[hits].astype(np.int32)}
