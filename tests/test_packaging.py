"""Packaging: compatible ranges, the lock (libtpu included), accelerator
extras, assets, light imports, and an install that keeps the environment's
own jax.
"""
import ast
import importlib.metadata
import json
import os
import re
import runpy
import subprocess
import sys
import types
from unittest import mock

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

import jaxfid
from jaxfid.commands import seqio_tasks
from jaxfid.core.errors import InputError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOCK = os.path.join(ROOT, "requirements-lock.txt")
# The JAX stack: its ranges are tested at both ends (the lock: lower end).
JAX_STACK = ("jax", "flax", "optax", "orbax-checkpoint")
ACCELERATORS = ("tpu", "cuda12", "cuda13")
SEQIO_STACK = {"seqio", "tensorflow", "tensorflow-text", "tensorflow-datasets"}


def _setup_kwargs() -> dict:
  """What setup.py passes to ``setuptools.setup`` (run with a stand-in
  setuptools: a Python 3.12 virtualenv has none)."""
  captured = {}
  fake = types.ModuleType("setuptools")
  fake.setup = captured.update
  fake.find_packages = lambda **kwargs: []
  with mock.patch.dict(sys.modules, {"setuptools": fake}):
    runpy.run_path(os.path.join(ROOT, "setup.py"))
  return captured


def _requirements(extra: str | None = None) -> list[Requirement]:
  kwargs = _setup_kwargs()
  specs = (kwargs["install_requires"] if extra is None
           else kwargs["extras_require"][extra])
  return [Requirement(spec) for spec in specs]


def _lock() -> dict[str, str]:
  """``{canonical name: version}`` of requirements-lock.txt."""
  pins = {}
  with open(LOCK, encoding="utf-8") as f:
    for line in f:
      line = line.split("#")[0].strip()
      if line:
        name, sep, version = line.partition("==")
        assert sep and version, f"{LOCK}: {line!r} is not name==version"
        pins[_canonical(name)] = version
  return pins


def _canonical(name: str) -> str:
  return re.sub(r"[-_.]+", "-", name).lower()


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


def test_requirements_are_ranges_without_jaxlib():
  """Every requirement is a range with a lower end, no exact pin; jaxfid
  leaves jaxlib (CPU, CUDA or TPU) to jax and its accelerator extras."""
  kwargs = _setup_kwargs()
  for extra, specs in [(None, kwargs["install_requires"]),
                       *kwargs["extras_require"].items()]:
    for spec in specs:
      req = Requirement(spec)
      ops = {s.operator for s in req.specifier}
      assert ">=" in ops and not ops & {"==", "==="}, (extra, spec)
      assert req.name != "jaxlib", (extra, spec)
  assert kwargs["python_requires"] == ">=3.11"


def test_accelerator_extras_follow_jax():
  """jaxfid[tpu|cuda12|cuda13] pull jax's extra of that name over the base
  range of jax; nothing else."""
  jax, = [r for r in _requirements() if r.name == "jax"]
  assert str(jax.specifier) == "<0.13,>=0.10.2"
  for name in ACCELERATORS:
    req, = _requirements(name)
    assert (req.name, req.extras, req.specifier) == ("jax", {name},
                                                      jax.specifier)


def test_heavy_stacks_are_extras():
  """TensorFlow / seqio only for the seqio tasks, bm25s only for benchmarks,
  torch only for the PyTorch-reference tests, uvicorn and Starlette only for
  `jaxfid serve` (the serve extra). jaxfid/ imports none of them,
  except the seqio stack inside jaxfid/commands' functions (tests/
  test_imports.py) for tasks/, which imports it."""
  base = {r.name for r in _requirements()}
  seqio = {r.name for r in _requirements("seqio")}
  bench = {r.name for r in _requirements("bench")}
  assert seqio == SEQIO_STACK and bench == {"bm25s"}
  assert {r.name for r in _requirements("torch")} == {"torch"}
  serve = {r.name for r in _requirements("serve")}
  assert serve == {"uvicorn", "starlette"}
  assert {r.name for r in _requirements("test")} >= seqio | bench | serve
  assert not (seqio | bench | serve | {"torch", "transformers"}) & base
  assert not {"bm25s", "torch", "transformers"} & _imported_top_names("jaxfid")
  library = set()
  for name in os.listdir(os.path.join(ROOT, "jaxfid")):
    if os.path.isdir(os.path.join(ROOT, "jaxfid", name)) and name != "commands":
      library |= _imported_top_names(os.path.join("jaxfid", name))
  assert not {"seqio", "tensorflow", "tensorflow_datasets", "tensorflow_text",
              "tasks"} & library
  assert not {"bm25s", "torch"} & _imported_top_names("tasks")


def test_every_import_is_a_requirement():
  """Each third-party module jaxfid/ imports comes from a distribution
  setup.py requires: the base install, the seqio extra for the seqio
  stack (imported inside jaxfid/commands' functions only), or the serve
  extra for uvicorn and Starlette (inside `jaxfid serve`'s functions)."""
  declared = {_canonical(r.name) for r in _requirements()}
  seqio = {_canonical(r.name) for r in _requirements("seqio")}
  serve = {_canonical(r.name) for r in _requirements("serve")}
  distributions = importlib.metadata.packages_distributions()
  names = (_imported_top_names("jaxfid") - set(sys.stdlib_module_names)
           - {"jaxfid", "tasks", "__future__"})
  assert {"jax", "flax", "etils", "tensorstore"} <= names
  for name in sorted(names):
    dists = {_canonical(d) for d in distributions.get(name, [])}
    assert dists, f"jaxfid imports {name}, which no installed package provides"
    assert dists & (declared | seqio | serve), (name, dists)
    if dists & seqio:
      assert name in {"seqio", "tensorflow"}, name
    if dists & serve:
      assert name in {"uvicorn", "starlette"}, name


def test_lock_pins_every_requirement_at_the_lower_end():
  """requirements-lock.txt pins every requirement of the base and of the
  test, seqio, bench, serve and torch extras inside its range; the JAX stack's
  ranges start at the lock's versions (so `make test` tests the lower end)."""
  lock = _lock()
  for extra in (None, "test", "seqio", "bench", "serve", "torch", "tpu"):
    for req in _requirements(extra):
      name = _canonical(req.name)
      assert name in lock, f"{req.name} is not in requirements-lock.txt"
      assert req.specifier.contains(Version(lock[name]), prereleases=True), (
          req, lock[name])
  for req in _requirements():
    if req.name in JAX_STACK:
      lower, = [s.version for s in req.specifier if s.operator == ">="]
      assert lock[req.name] == lower, (req, lock[req.name])
  assert lock["jaxlib"] == lock["jax"]


def test_the_test_install_has_the_tpu_and_gpu_compilers():
  """`make test` (so .ci/run) and `make lock` install the tpu and gpu-aot
  extras; the lock pins libtpu and the CUDA plugin at what the locked jax's
  extras require; gpu-aot is jax's cuda12 extra."""
  with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as f:
    makefile = f.read()
  extras = "test,torch,tpu,gpu-aot"
  assert f"$(PIP) install -c $(LOCK) -e '.[{extras}]'" in makefile
  assert f"$(LOCK_VENV)/bin/python -m pip install -e '.[{extras}]'" in (
      makefile)
  req, = _requirements("gpu-aot")
  assert (req.name, req.extras) == ("jax", {"cuda12"})
  lock = _lock()
  assert "libtpu" in lock
  assert lock["jax-cuda12-plugin"] == lock["jax-cuda12-pjrt"] == lock["jax"]
  if importlib.metadata.version("jax") != lock["jax"]:
    pytest.skip("the installed jax is not the lock's")
  pins = [Requirement(r) for r in importlib.metadata.requires("jax")]
  libtpu = [r for r in pins if r.name == "libtpu" and r.marker
            and r.marker.evaluate({"extra": "tpu"})]
  assert libtpu, pins
  for req in libtpu:
    assert req.specifier.contains(Version(lock["libtpu"])), (req, lock)


def test_installed_versions_are_in_range():
  """The environment running the suite satisfies setup.py (both stacks)."""
  for extra in (None, "test", "torch"):
    for req in _requirements(extra):
      try:
        installed = importlib.metadata.version(req.name)
      except importlib.metadata.PackageNotFoundError:
        assert extra == "torch", f"{req.name} is not installed"
        continue
      assert req.specifier.contains(Version(installed), prereleases=True), (
          req, installed)


def test_the_demo_install_runs_what_the_demo_prints():
  """`make demo` runs the venv's jaxfid and installs the serve extra, so
  the `jaxfid serve` command the demo prints last runs in that venv."""
  with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as f:
    makefile = f.read()
  assert "$(PIP) install -c $(LOCK) -e '.[serve]'" in makefile
  assert "\t$(VENV)/bin/jaxfid demo\n" in makefile
  assert _requirements("serve")  # the extra exists in setup.py


def test_environment_matches_the_lock():
  """Under `make test` (JAXFID_LOCK set) every locked package is installed
  at exactly the lock's version, and nothing outside the lock is."""
  lock_file = os.environ.get("JAXFID_LOCK")
  if not lock_file:
    pytest.skip("not a locked environment (`make test` sets JAXFID_LOCK)")
  assert os.path.samefile(os.path.join(ROOT, lock_file), LOCK)
  lock = _lock()
  installed = {_canonical(d.metadata["Name"]): d.version
               for d in importlib.metadata.distributions()}
  tools = {"jaxfid", "pip", "setuptools", "wheel"}
  assert not set(installed) - set(lock) - tools, "installed, not locked"
  for name, version in lock.items():
    assert installed.get(name) == version, (name, installed.get(name), version)


def _fake_jax(site, version: str) -> None:
  """Installed-package metadata of a CUDA 13 jax ``version`` in ``site`` (as
  pip sees a host's own accelerator jax: jax, jaxlib, the CUDA plugin)."""
  def dist(name, requires=(), extras=()):
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {r}" for r in requires]
    for extra, requirement in extras:
      lines += [f"Provides-Extra: {extra}",
                f'Requires-Dist: {requirement}; extra == "{extra}"']
    (info / "METADATA").write_text("\n".join(lines) + "\n")
    (info / "INSTALLER").write_text("pip\n")
  same = f"<={version},>={version}"
  dist("jax", [f"jaxlib{same}", "ml_dtypes>=0.5.0", "numpy>=2.0",
               "opt_einsum", "scipy>=1.14"],
       [(name, f"jaxlib{same}") for name in ACCELERATORS]
       + [("cuda13", f"jax-cuda13-plugin{same}")])
  dist("jaxlib", ["scipy>=1.13", "numpy>=2.0", "ml_dtypes>=0.5.0"])
  dist("jax-cuda13-plugin", [f"jax-cuda13-pjrt=={version}"])
  dist("jax-cuda13-pjrt")


def _dry_run_install(site, requirements: list[str], tmp_path):
  """``pip install --dry-run --no-index`` of ``requirements`` with ``site``
  first on the path: what pip would install (nothing can be downloaded)."""
  env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
  env.update(PYTHONPATH=str(site), PIP_CONFIG_FILE=os.devnull,
             PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
  reqs = tmp_path / "requirements.txt"
  reqs.write_text("\n".join(requirements) + "\n")
  report = tmp_path / "report.json"
  seen = subprocess.run(
      [sys.executable, "-c", "import importlib.metadata as m; "
       "print(m.version('jax'))"], env=env, capture_output=True, text=True,
      timeout=60).stdout.strip()
  done = subprocess.run(
      [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index",
       "--quiet", "--report", str(report), "-r", str(reqs)],
      env=env, capture_output=True, text=True, timeout=300)
  installs = (json.loads(report.read_text())["install"]
              if done.returncode == 0 else None)
  return seen, done, installs


def test_install_keeps_a_compatible_jax(tmp_path):
  """Installing jaxfid where another compatible jax is installed (an H200
  host's jax 0.11.2 for CUDA 13, say) keeps that jax: pip's resolver, given
  that jax and this environment, has nothing to install or replace, for
  jaxfid and for jaxfid[cuda13]. A jax outside the range is not kept."""
  installed = importlib.metadata.version("jax")
  other = "0.11.2" if installed != "0.11.2" else "0.12.0"
  try:  # jaxfid's requirements as installed, else as setup.py says
    requires = importlib.metadata.requires("jaxfid") or []
  except importlib.metadata.PackageNotFoundError:
    requires = [str(r) for r in _requirements()] + [
        f"{r}; extra == 'cuda13'" for r in _requirements("cuda13")]
  base = [r for r in requires if "extra ==" not in r]
  cuda13 = base + [r.split(";")[0] for r in requires
                   if re.search(r"extra == .cuda13.", r)]
  assert any(r.startswith("jax[cuda13]") for r in cuda13), requires
  for requirements in (base, cuda13):
    site = tmp_path / f"site{len(requirements)}"
    _fake_jax(site, other)
    seen, done, installs = _dry_run_install(site, requirements, tmp_path)
    assert seen == other  # the environment has that jax
    assert done.returncode == 0, done.stderr
    assert installs == [], [i["metadata"]["name"] for i in installs]
  # Sensitivity: a jax below the range would have to be replaced (and, with
  # no index to replace it from, the resolution fails naming jax).
  _fake_jax(tmp_path / "old", "0.9.0")
  seen, done, _ = _dry_run_install(tmp_path / "old", base, tmp_path)
  assert seen == "0.9.0" and done.returncode != 0
  assert "No matching distribution found for jax<" in done.stderr, done.stderr


def test_vocab_and_licence_are_package_data():
  assets = os.path.join(os.path.dirname(jaxfid.__file__), "assets")
  assert sorted(os.listdir(assets)) == [
      "LICENSE.spiece", "SOURCE.spiece.txt", "lmbff", "spiece.model"]
  sst2 = os.path.join(assets, "lmbff", "SST-2", "16-13")
  assert sorted(os.listdir(sst2)) == ["dev.tsv", "test.tsv", "train.tsv"]
  assert os.path.getsize(os.path.join(assets, "spiece.model")) == 791656
  with open(os.path.join(assets, "LICENSE.spiece"), encoding="utf-8") as f:
    assert "Apache License" in f.read()
  package_data = _setup_kwargs()["package_data"]
  assert package_data["jaxfid.assets"] == ["*", "lmbff/*", "lmbff/*/*/*"]
  # jaxfid serve's page
  assert package_data["jaxfid.serving"] == ["static/*"]
  static = os.path.join(os.path.dirname(jaxfid.__file__), "serving", "static")
  assert sorted(os.listdir(static)) == ["index.html", "page.css", "page.js"]


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
    "import jaxfid.core.tokenization, jaxfid.evaluation.qa, jaxfid.reader.examples",
])
def test_light_imports(statement):
  modules = _modules_after(statement)
  for heavy in ("jax", "tensorflow", "torch", "seqio", "flax", "transformers"):
    assert heavy not in modules, f"{statement!r} imports {heavy}"


def test_fid_training_needs_no_tensorflow():
  """FiD files train without the seqio extra: the train command and the
  methods import no TensorFlow or seqio (only MIXTURE_OR_TASK_NAME does)."""
  modules = _modules_after("import jaxfid.cli, jaxfid.commands.train, "
                           "jaxfid.methods, jaxfid.training.loop")
  assert "jax" in modules and "flax" in modules
  for heavy in ("tensorflow", "seqio", "tensorflow_datasets", "tasks"):
    assert heavy not in modules, heavy


def test_seqio_tasks_without_tensorflow_name_the_extra(monkeypatch):
  monkeypatch.setitem(sys.modules, "tensorflow", None)  # not installed
  with pytest.raises(InputError, match=r"pip install 'jaxfid\[seqio\]'"):
    seqio_tasks.import_tasks()


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
