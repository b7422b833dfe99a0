"""jaxfid.runtime.platforms: a CPU host with libtpu stays a CPU host.

The decision is checked on stand-in hosts (a directory as the file system's
root, a dict as the environment); the behaviour on this host, where libtpu
is installed by the ``tpu`` extra and no TPU is attached, in subprocesses
that start as a user's would (no ``JAX_PLATFORMS``): a command that starts
JAX's backend says only its own line on stderr, a ``JAX_PLATFORMS`` the
user set is kept, the CPU malloc settings apply, and libtpu still compiles
for a TPU topology (marked ``tpu``), quietly inside
``platforms.libtpu_as_compiler()``. Those skip without libtpu.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from jaxfid.runtime import host_memory, platforms

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def host(tmp_path, monkeypatch):
  """A stand-in root without a TPU, JAX not started, only libtpu installed."""
  lib = tmp_path / "libtpu.so"
  lib.write_bytes(b"")
  monkeypatch.setattr(platforms, "_jax_state", lambda: (False, None))
  monkeypatch.setattr(platforms, "accelerator_plugins", lambda environ: [])
  env = {"TPU_LIBRARY_PATH": str(lib)}
  return tmp_path, env


def _pci(root, name, vendor, pci_class):
  device = root / "sys/bus/pci/devices" / name
  device.mkdir(parents=True)
  (device / "vendor").write_text(vendor + "\n")
  (device / "class").write_text(pci_class + "\n")


def test_a_host_without_a_tpu_runs_on_the_cpu(host):
  root, env = host
  _pci(root, "0000:00:03.0", "0x1af4", "0x010000")  # virtio disk
  _pci(root, "0000:00:04.0", "0x1ae0", "0x020000")  # gVNIC
  _pci(root, "0000:00:05.0", "0x1ae0", "0x010802")  # Google NVMe
  (root / "dev/vfio").mkdir(parents=True)
  (root / "dev/vfio/vfio").write_text("")  # the control node, no group
  assert platforms.tpu_hints(env, str(root)) == []
  decided = platforms.exclude_absent_tpu(env, str(root))
  assert decided == {"jax_platforms": "cpu",
                     "reason": "libtpu installed on a host without a TPU"}
  assert env["JAX_PLATFORMS"] == "cpu"


@pytest.mark.parametrize("make, hint", [
    (lambda r: _pci(r, "0000:00:05.0", "0x1ae0", "0x120000"),
     "Google PCI device 0000:00:05.0"),
    (lambda r: _pci(r, "0000:00:06.0", "0x1ae0", "0x0b4000"),
     "Google PCI device 0000:00:06.0"),
    (lambda r: ((r / "dev").mkdir(), (r / "dev/accel0").write_text("")),
     "dev/accel0"),
    (lambda r: ((r / "dev/vfio").mkdir(parents=True),
                (r / "dev/vfio/12").write_text("")), "dev/vfio/12"),
])
def test_anything_like_a_tpu_leaves_jax_its_choice(host, make, hint):
  root, env = host
  make(root)
  hints = platforms.tpu_hints(env, str(root))
  assert len(hints) == 1 and hints[0].endswith(hint), hints
  decided = platforms.exclude_absent_tpu(env, str(root))
  assert decided["jax_platforms"] is None
  assert decided["reason"].startswith("this host may have a TPU (")
  assert "JAX_PLATFORMS" not in env


def test_the_user_and_tpu_variables_decide(host, monkeypatch):
  root, env = host
  for name in platforms.TPU_ENV_HINTS:
    assert platforms.decide({**env, name: "1"}, str(root))[
        "jax_platforms"] is None, name
  for value in ("", "tpu,cpu"):  # '' asks JAX to choose
    assert platforms.exclude_absent_tpu(
        {**env, "JAX_PLATFORMS": value}, str(root)) == {
            "jax_platforms": None,
            "reason": f"JAX_PLATFORMS={value!r} set by the user"}
  monkeypatch.setattr(platforms, "_jax_state", lambda: (False, "cpu"))
  assert platforms.decide(env, str(root))["reason"] == (
      "jax_platforms='cpu' set by the user")
  monkeypatch.setattr(platforms, "_jax_state", lambda: (True, None))
  assert platforms.decide(env, str(root))["reason"] == (
      "JAX's backend has already started")


def test_without_libtpu_nothing_changes(host, monkeypatch):
  root, env = host
  monkeypatch.setattr(platforms.importlib.util, "find_spec", lambda name: None)
  assert platforms.decide({}, str(root)) == {
      "jax_platforms": None, "reason": "no libtpu installed"}
  assert platforms.decide(env, str(root))["jax_platforms"] == "cpu"


def test_gpu_plugins_stay_other_plugins_leave_jax_its_choice(host,
                                                            monkeypatch):
  root, env = host
  monkeypatch.setattr(platforms, "accelerator_plugins",
                      lambda environ: ["xla_cuda12"])
  # no NVIDIA GPU: the plugin's cuInit would fail loudly, so it is left out
  assert platforms.gpu_hints(str(root)) == []
  assert platforms.decide(env, str(root)) == {
      "jax_platforms": "cpu",
      "reason": "libtpu installed on a host without a TPU; a CUDA plugin "
                "installed on a host without an NVIDIA GPU"}
  monkeypatch.setattr(platforms, "libtpu_installed",  # env: libtpu's path
                      lambda environ: "TPU_LIBRARY_PATH" in environ)
  assert platforms.decide({}, str(root)) == {
      "jax_platforms": "cpu", "reason": "a CUDA plugin installed on a host "
                                        "without an NVIDIA GPU"}
  _pci(root, "0000:00:06.0", "0x10de", "0x020000")  # NVIDIA's network card
  assert platforms.decide(env, str(root))["jax_platforms"] == "cpu"
  _pci(root, "0000:00:07.0", "0x10de", "0x030200")  # a 3D controller: a GPU
  assert platforms.gpu_hints(str(root)) == [
      "NVIDIA PCI device 0000:00:07.0"]
  assert platforms.decide(env, str(root))["jax_platforms"] == "cuda,cpu"
  assert platforms.decide({}, str(root)) == {
      "jax_platforms": None,
      "reason": "a CUDA plugin installed and an NVIDIA GPU present"}
  (root / "dev").mkdir(exist_ok=True)
  (root / "dev/nvidia0").write_text("")
  assert platforms.gpu_hints(str(root))[-1] == str(root / "dev/nvidia0")
  monkeypatch.setattr(platforms, "accelerator_plugins",
                      lambda environ: ["xla_cuda12", "xla_rocm7"])
  assert platforms.decide(env, str(root)) == {
      "jax_platforms": None,
      "reason": "plugin xla_rocm7 installed: its platform is unknown"}


def test_libtpu_as_compiler_sets_its_variables_for_the_block_only(host):
  root, env = host
  with platforms.libtpu_as_compiler(env, str(root)):
    assert env["TPU_WORKER_HOSTNAMES"] == "localhost"
    assert env["TPU_ACCELERATOR_TYPE"]
  assert "TPU_WORKER_HOSTNAMES" not in env
  assert "TPU_ACCELERATOR_TYPE" not in env
  mine = {**env, "TPU_WORKER_HOSTNAMES": "10.0.0.2"}  # a TPU VM's own
  with platforms.libtpu_as_compiler(mine, str(root)):
    assert mine["TPU_WORKER_HOSTNAMES"] == "10.0.0.2"
    assert "TPU_ACCELERATOR_TYPE" not in mine
  assert mine["TPU_WORKER_HOSTNAMES"] == "10.0.0.2"


def test_malloc_settings_ignore_a_libtpu_left_out(monkeypatch):
  monkeypatch.setattr(host_memory, "accelerators_installed",
                      lambda: [platforms.LIBTPU])
  monkeypatch.setattr(host_memory, "_backend_started", lambda: False)
  env = {"JAX_PLATFORMS": "cpu"}
  if host_memory.why_not({}) == "not glibc":
    pytest.skip("glibc malloc only")
  assert host_memory.why_not(env) is None
  assert host_memory.why_not({}) == "accelerator plugin libtpu installed"
  assert host_memory.why_not({"JAX_PLATFORMS": "cpu,tpu"}) == (
      "accelerator plugin libtpu installed")


# This host, as a user starts jaxfid on it: libtpu installed, no TPU.

def _user_env(**changes) -> dict:
  """This environment less what the suite and a TPU VM would set."""
  drop = {"JAX_PLATFORMS", host_memory.ENV_VAR, *platforms.TPU_ENV_HINTS}
  env = {k: v for k, v in os.environ.items() if k not in drop}
  env["PYTHONPATH"] = os.pathsep.join(
      [ROOT] + [p for p in [env.get("PYTHONPATH")] if p])
  env.update(changes)
  return env


@pytest.fixture
def libtpu_cpu_host():
  pytest.importorskip("libtpu")
  if platforms.tpu_hints():
    pytest.skip("this host may have a TPU")
  others = [p for p in platforms.accelerator_plugins()
            if platforms.CUDA not in p.lower()]
  if others:
    pytest.skip(f"plugin {others[0]} installed")


def test_a_command_that_starts_jax_says_only_its_own_line(libtpu_cpu_host,
                                                          tmp_path):
  """`jaxfid index dense` starts JAX's backend before it looks for the
  checkpoint; stderr holds its one error line, nothing from libtpu."""
  missing = tmp_path / "missing"
  corpus = os.path.join(ROOT, "tests/data/retrieval/squad_sample",
                        "paragraphs.jsonl")
  done = subprocess.run(
      [sys.executable, "-m", "jaxfid", "index", "dense", "--checkpoint",
       str(missing), "--corpus", corpus, "--output", str(tmp_path / "out")],
      env=_user_env(), capture_output=True, text=True, timeout=300)
  assert done.returncode == 2, done.stderr
  assert done.stderr.splitlines() == [
      f"jaxfid index: error: {missing}: no such checkpoint"], done.stderr


PROBE = textwrap.dedent("""
    import json, os
    import jaxfid
    from jaxfid.runtime import host_memory
    decided = host_memory.why_not()
    import jax
    print(json.dumps({"env": os.environ.get("JAX_PLATFORMS"),
                      "config": jax.config.jax_platforms,
                      "malloc": decided}))
""")


def _probe(**changes) -> dict:
  done = subprocess.run([sys.executable, "-c", PROBE],
                        env=_user_env(**changes), capture_output=True,
                        text=True, timeout=300, check=True)
  return json.loads(done.stdout.strip().splitlines()[-1])


def test_this_host_runs_on_the_cpu_with_the_cpu_malloc(libtpu_cpu_host):
  found = _probe()
  platforms_set = found.pop("env")
  assert platforms_set in ("cpu", "cuda,cpu")
  assert found["config"] == platforms_set
  if platforms_set == "cpu" and found["malloc"] != "not glibc":
    assert found["malloc"] is None  # the CPU settings apply


def test_a_jax_platforms_the_user_set_is_kept(libtpu_cpu_host):
  assert _probe(JAX_PLATFORMS="cpu")["env"] == "cpu"
  auto = _probe(JAX_PLATFORMS="")  # JAX chooses (it probes for a TPU)
  assert (auto["env"], auto["config"]) == ("", "")
  if auto["malloc"] != "not glibc":
    assert auto["malloc"].startswith("accelerator plugin ")


TOPOLOGY = textwrap.dedent("""
    import jaxfid
    from jax.experimental import topologies
    from jaxfid.runtime import platforms
    with platforms.libtpu_as_compiler():
      devices = topologies.get_topology_desc(
          platform="tpu", topology_name="v5e:2x2", chip_config_name="default",
          chips_per_host_bounds=(2, 2, 1), num_slices=1).devices
    import jax
    print(len(devices), devices[0].platform, jax.devices()[0].platform)
""")


@pytest.mark.tpu
def test_the_tpu_compiler_loads_quietly_next_to_the_cpu(libtpu_cpu_host):
  """A TPU topology's devices for compiling, the CPU for running, and not
  a line from libtpu on stderr."""
  done = subprocess.run([sys.executable, "-c", TOPOLOGY], env=_user_env(),
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr
  assert done.stdout.split() == ["4", "tpu", "cpu"]
  assert done.stderr == ""


def test_jax_imported_first_is_kept_off_the_tpu_too(libtpu_cpu_host):
  """A library user who imports jax before jaxfid: jax.config takes the
  setting (jax read the environment at its import), and the backend starts
  without a line from libtpu."""
  code = ("import jax\nassert jax.config.jax_platforms is None\n"
          "import jaxfid\nprint(jax.config.jax_platforms, "
          "jax.devices()[0].platform)\n")
  done = subprocess.run([sys.executable, "-c", code], env=_user_env(),
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr
  assert done.stdout.split()[1] in ("cpu", "gpu")
  assert done.stdout.split()[0] in ("cpu", "cuda,cpu")
  assert done.stderr == ""
