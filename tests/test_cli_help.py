"""The command line's help, its messages for mistyped flags, and its
progress bars on a log file."""
import io

import pytest
from tqdm import tqdm

from jaxfid.cli import build_parser, main, mistyped_option
from jaxfid.runtime import console


@pytest.mark.parametrize("argv, line", [
    (["predict", "--ncontext", "3"], "jaxfid predict: error: unrecognized "
     "argument --ncontext (did you mean --n-context?)"),
    (["index", "bm25", "--corpas=c.tsv"], "jaxfid index bm25: error: "
     "unrecognized argument --corpas (did you mean --corpus?)"),
    (["train", "--gin_fle=x.gin"], "jaxfid train: error: unrecognized "
     "argument --gin_fle (did you mean --gin_file?)"),
])
def test_a_mistyped_flag_gets_did_you_mean(argv, line, capsys):
  assert main(argv) == 2
  out, err = capsys.readouterr()
  assert out == "" and err == line + "\n"


@pytest.mark.parametrize("argv", [
    ["predict", "--n-context", "3"],  # right
    ["demo", "--step", "5"],  # a unique prefix: argparse's abbreviation
    ["train", "--gin.TRAIN_STEPZ=5"],  # a gin binding (gin says the rest)
    ["predict", "--zzzzzz"],  # nothing close: argparse's own message
    ["demo", "--clusters", "3"],  # far from --steps (0.71): no suggestion
    ["predict", "--", "--ncontext"],
])
def test_what_is_not_a_typo(argv):
  assert mistyped_option(build_parser(), argv) is None


def _help(capsys, *argv) -> str:
  with pytest.raises(SystemExit):
    main([*argv, "--help"])
  return " ".join(capsys.readouterr().out.split())


def test_train_help_names_gin_flags_and_the_configuration_page(capsys):
  text = _help(capsys, "train")
  assert "--gin.NAME=VALUE" in text and "docs/configuration.md" in text
  assert "--gin.MODEL_DIR=\"'runs/x'\"" in text


def test_demo_help_describes_each_flag_with_its_default(capsys):
  text = _help(capsys, "demo")
  for flag, default in [("--steps", "1000"), ("--batch-size", "32"),
                        ("--n-context", "4"), ("--output", "demo_out"),
                        ("--dev-questions", "200"),
                        ("--test-questions", "200"), ("--seed", "0")]:
    assert f"{flag} {flag[2:].upper().replace('-', '_')} " in text
    assert f"(default: {default})" in text
  parser = build_parser()
  demo = parser._subparsers._group_actions[0].choices["demo"]
  assert all(a.help for a in demo._actions)


def test_top_level_help_names_every_method(capsys):
  text = _help(capsys)
  for method in ("FiD", "Atlas", "ReAtt", "ReFusion"):
    assert method in text


def test_an_inner_bar_writes_no_cursor_codes_to_a_file(tmp_path):
  """An evaluation's bar inside training's, both on a log file: no ESC[A
  (tqdm's nesting moves the cursor up); on a terminal tqdm nests."""
  with open(tmp_path / "log", "w") as log:
    outer = tqdm(total=2, file=log)
    outer.update(1)
    for _ in console.inner_bar(range(3), file=log, leave=False):
      pass
    outer.update(1)
    outer.close()
  text = (tmp_path / "log").read_text()
  assert "2/2" in text and "\x1b[A" not in text

  class Terminal(io.StringIO):
    def isatty(self):
      return True

  screen = Terminal()
  outer = tqdm(total=2, file=screen)
  for _ in console.inner_bar(range(3), file=screen, leave=False):
    pass
  outer.close()
  assert "\x1b[A" in screen.getvalue()  # nested below the outer bar
