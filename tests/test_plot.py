"""`jaxfid plot`: EM against number of passages from fake predict outputs."""
import json
import os

import numpy as np
import pytest
from PIL import Image

from jaxfid.fid import plot as plotting
from jaxfid.cli import main
from jaxfid.core.errors import InputError


def _predictions(path, ems):
  """A `jaxfid predict`-style JSONL with the given per-example `em`."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    for i, em in enumerate(ems):
      f.write(json.dumps({"id": i, "question": f"q{i}", "prediction": "p",
                          "answers": [] if em is None else ["a"],
                          "em": em, "f1": em}) + "\n")
  return str(path)


def _last_json(capsys):
  return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_plot_from_triples_directory_and_runs_json(tmp_path, capsys):
  base5 = _predictions(tmp_path / "a" / "p5.jsonl", [1, 0, 0, 0])
  base1 = _predictions(tmp_path / "a" / "p1.jsonl", [0, 0, 0, 1.0, None])
  _predictions(tmp_path / "runs" / "large_n10.jsonl", [1, 1, 0, 0])
  _predictions(tmp_path / "runs" / "large_n100.jsonl", [1, 1, 1, 0])
  _predictions(tmp_path / "runs" / "notes.jsonl", [0])  # ignored: no _nN
  runs_json = tmp_path / "more" / "runs.json"
  _predictions(tmp_path / "more" / "b.jsonl", [1, 1])
  runs_json.write_text(json.dumps(
      [{"label": "base", "n_context": 50, "path": "b.jsonl"}]))
  out = tmp_path / "figs" / "fig3.png"
  rc = main(["plot", "--runs", f"base:5:{base5}", f"base:1:{base1}",
             str(tmp_path / "runs"), "--runs-json", str(runs_json),
             "--output", str(out), "--title", "NQ dev"])
  assert rc == 0
  printed = _last_json(capsys)
  assert printed["output"] == str(out)
  got = {s["label"]: [(p["n_context"], p["em"], p["examples"])
                      for p in s["points"]] for s in printed["series"]}
  assert got == {"base": [(1, 0.25, 4), (5, 0.25, 4), (50, 1.0, 2)],
                 "large": [(10, 0.5, 4), (100, 0.75, 4)]}
  assert [s["label"] for s in printed["series"]] == ["base", "large"]
  with Image.open(out) as image:
    assert image.format == "PNG"
    pixels = np.asarray(image.convert("RGB"))
  assert pixels.shape[0] > 100 and pixels.shape[1] > 100
  assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 10  # not blank
  assert [n for n in os.listdir(out.parent)] == ["fig3.png"]  # no temp left


def test_single_named_file_and_svg(tmp_path, capsys):
  path = _predictions(tmp_path / "fid_n25.jsonl", [1, 0])
  out = tmp_path / "one.svg"
  assert main(["plot", "--runs", path, "--output", str(out)]) == 0
  assert _last_json(capsys)["series"] == [{"label": "fid", "points": [
      {"n_context": 25, "em": 0.5, "examples": 2, "path": path}]}]
  assert out.read_text().lstrip().startswith("<?xml")


@pytest.mark.parametrize("make_args,message", [
    (lambda d: ["--runs", "x:5:" + str(d / "missing.jsonl")],
     "no such prediction file"),
    (lambda d: ["--runs", _predictions(d / "plain.jsonl", [1])],
     "cannot tell the label"),
    (lambda d: ["--runs", "a:5:" + _predictions(d / "p.jsonl", [None])],
     "no scored predictions"),
    (lambda d: ["--runs", "a:5:" + _predictions(d / "p.jsonl", [1]),
                "a:5:" + _predictions(d / "q.jsonl", [0])],
     "already has a run with 5 passages"),
    (lambda d: ["--runs", "a:0:" + _predictions(d / "p.jsonl", [1])],
     "at least 1"),
    (lambda d: [], "give at least one run"),
])
def test_bad_runs_exit_2_without_output(tmp_path, capsys, make_args, message):
  out = tmp_path / "fig.png"
  assert main(["plot", *make_args(tmp_path), "--output", str(out)]) == 2
  err = capsys.readouterr().err
  assert message in err and len(err.strip().splitlines()) == 1
  assert not out.exists()


def test_bad_prediction_lines_name_the_line(tmp_path):
  path = tmp_path / "p.jsonl"
  path.write_text('{"em": 1}\n\n{"prediction": "x"}\n')
  with pytest.raises(InputError, match=r"p.jsonl:3: no \"em\" field"):
    plotting.run_em(str(path))
  path.write_text('{"em": 1}\n{"em": "yes"}\n')
  with pytest.raises(InputError, match=r"p.jsonl:2: \"em\" must be"):
    plotting.run_em(str(path))
  path.write_text('{"em": 1}\n{oops\n')
  with pytest.raises(InputError, match=r"p.jsonl:2: invalid JSON"):
    plotting.run_em(str(path))


def test_bad_runs_json_and_output_format(tmp_path):
  runs = tmp_path / "runs.json"
  runs.write_text(json.dumps([{"label": "a", "path": "x.jsonl"}]))
  with pytest.raises(InputError, match="entry 1: missing n_context"):
    plotting.read_runs_json(str(runs))
  runs.write_text(json.dumps([{"label": "a", "n_context": "5",
                               "path": "x.jsonl"}]))
  with pytest.raises(InputError, match="must be an integer"):
    plotting.read_runs_json(str(runs))
  with pytest.raises(InputError, match="unknown image format"):
    plotting.output_format(str(tmp_path / "fig.xyz"))
