"""Packaging: pins match what the tests run on, assets ship, imports stay light.
"""
import ast
import importlib.metadata
import os
import subprocess
import sys

import pytest

import jaxfid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


LISTS = ("INSTALL_REQUIRES", "TEST_REQUIRES", "BENCH_REQUIRES")


def _setup_lists() -> dict[str, list[str]]:
  """The INSTALL_REQUIRES / TEST_REQUIRES / BENCH_REQUIRES literals."""
  with open(os.path.join(ROOT, "setup.py"), encoding="utf-8") as f:
    tree = ast.parse(f.read())
  out = {}
  for node in tree.body:
    if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
      if node.targets[0].id in LISTS:
        out[node.targets[0].id] = ast.literal_eval(node.value)
  return out


def _imported_top_names(directory: str) -> set[str]:
  names = set()
  for root, _, files in os.walk(os.path.join(ROOT, directory)):
    for name in files:
      if name.endswith(".py"):
        with open(os.path.join(root, name), encoding="utf-8") as f:
          tree = ast.parse(f.read())
        for node in ast.walk(tree):
          if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
          elif isinstance(node, ast.ImportFrom) and not node.level:
            names.add((node.module or "").split(".")[0])
  return names


def test_bench_extras_stay_out_of_the_library():
  """What only benchmarks (and tests) compare with is not installed by
  default, and nothing under jaxfid/ imports it."""
  lists = _setup_lists()
  bench = {spec.partition("==")[0] for spec in lists["BENCH_REQUIRES"]}
  assert bench == {"bm25s"}
  installed = {spec.partition("==")[0] for spec in lists["INSTALL_REQUIRES"]}
  assert not bench & installed
  assert not bench & (_imported_top_names("jaxfid")
                      | _imported_top_names("tasks"))


def test_pins_match_installed_versions():
  lists = _setup_lists()
  assert set(lists) == set(LISTS)
  for spec in (lists["INSTALL_REQUIRES"] + lists["TEST_REQUIRES"]
               + lists["BENCH_REQUIRES"]):
    name, sep, pinned = spec.partition("==")
    assert sep, f"{spec} is not pinned"
    installed = importlib.metadata.version(name)
    assert installed.split("+")[0] == pinned, (name, installed, pinned)


def test_vocab_and_licence_are_package_data():
  assets = os.path.join(os.path.dirname(jaxfid.__file__), "assets")
  assert sorted(os.listdir(assets)) == [
      "LICENSE.spiece", "SOURCE.spiece.txt", "lmbff", "spiece.model"]
  sst2 = os.path.join(assets, "lmbff", "SST-2", "16-13")
  assert sorted(os.listdir(sst2)) == ["dev.tsv", "test.tsv", "train.tsv"]
  assert os.path.getsize(os.path.join(assets, "spiece.model")) == 791656
  with open(os.path.join(assets, "LICENSE.spiece"), encoding="utf-8") as f:
    assert "Apache License" in f.read()
  with open(os.path.join(ROOT, "setup.py"), encoding="utf-8") as f:
    assert ('package_data={"jaxfid.assets": ["*", "lmbff/*", "lmbff/*/*/*"]}'
            in f.read())


def _modules_after(statement: str) -> set[str]:
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(
      [ROOT] + [p for p in [env.get("PYTHONPATH")] if p])
  code = f"{statement}\nimport sys\nprint(' '.join(sys.modules))"
  out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                       capture_output=True, text=True, timeout=60).stdout
  return set(out.split())


@pytest.mark.parametrize("statement", [
    "import jaxfid",
    "import jaxfid.core.tokenization, jaxfid.evaluation.qa, jaxfid.fid.examples",
])
def test_light_imports(statement):
  modules = _modules_after(statement)
  for heavy in ("jax", "tensorflow", "torch", "seqio", "flax", "transformers"):
    assert heavy not in modules, f"{statement!r} imports {heavy}"


def test_lazy_attributes():
  assert jaxfid.__version__ == "0.1.0"
  assert "load_t5" in dir(jaxfid)
  with pytest.raises(AttributeError, match="no attribute 'not_there'"):
    jaxfid.not_there  # pylint: disable=pointless-statement


def test_load_t5_registers_every_method():
  """``jaxfid.load_t5`` loads a MODEL_DIR of any method: it imports them all."""
  modules = _modules_after("import jaxfid\njaxfid.load_t5")
  assert {"jaxfid.methods", "jaxfid.checkpoints.load", "jaxfid.reatt.checkpoint",
          "jaxfid.refusion.model",
          "jaxfid.dual_encoder.checkpoint"} <= modules


def test_console_script_entry_point():
  try:
    dist = importlib.metadata.distribution("jaxfid")
  except importlib.metadata.PackageNotFoundError:
    pytest.skip("jaxfid is not installed (run from the source tree)")
  scripts = {e.name: e.value for e in dist.entry_points
             if e.group == "console_scripts"}
  assert scripts == {"jaxfid": "jaxfid.cli:main"}
  assert dist.version == jaxfid.__version__
