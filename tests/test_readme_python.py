"""The Python snippets of README.md and docs/checkpoints.md run as written
(on a tiny random T5 in place of the demo's checkpoint) and answer as
`jaxfid predict` does."""
import contextlib
import io
import pathlib
import re

import pytest

from hf_reference import make_tiny_hf_checkpoint
from jaxfid.checkpoints.load import load_t5
from jaxfid.reader import predict
from jaxfid.reader.examples import FidExample

ROOT = pathlib.Path(__file__).resolve().parent.parent
PYTHON = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _snippets(page: str) -> list[str]:
  text = (ROOT / page).read_text(encoding="utf-8")
  return [s for s in PYTHON.findall(text) if "jaxfid.load_t5(" in s]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  # the bundled T5 vocabulary's ids, a tiny model
  return make_tiny_hf_checkpoint(tmp_path_factory.mktemp("t5") / "hf",
                                 vocab_size=32128)


@pytest.mark.parametrize("page", ["README.md", "docs/checkpoints.md"])
def test_the_python_snippet_runs_as_written(page, checkpoint):
  snippet, = _snippets(page)
  assert '"demo_out/model"' in snippet  # what `make demo` leaves
  code = snippet.replace('"demo_out/model"', repr(str(checkpoint)))
  out, names = io.StringIO(), {}
  with contextlib.redirect_stdout(out):
    exec(compile(code, page, "exec"), names)  # pylint: disable=exec-used
  printed = out.getvalue().splitlines()[0]
  loaded = load_t5(checkpoint)
  question = names["question"]
  assert isinstance(question, FidExample) and len(question.ctxs) == 2
  expected, = predict.generate(loaded.model, loaded.params, loaded.tokenizer,
                               [question], n_context=2, text_maxlength=40,
                               answer_maxlength=6, batch_size=1,
                               progress=False)
  assert printed == expected
