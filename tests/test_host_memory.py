"""jaxfid.runtime.host_memory: glibc malloc settings for XLA on the CPU.

The behaviour that matters is counted, not timed: with the settings, a
program whose temporary buffer is larger than a glibc thread arena (64 MB)
stops page-faulting its buffer in anew on every execution.
"""
import json
import os
import platform
import subprocess
import sys
import textwrap

import pytest

from jaxfid import cli
from jaxfid.runtime import host_memory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"

# Runs a jitted function with ~130 MB of intermediates (XLA's temporary
# buffer) 40 times and prints the page faults of each execution. Tuned, the
# heap grows to its working size over the first runs (a run that grows it
# faults its new pages in), then the buffer is reused.
FAULTS_SCRIPT = textwrap.dedent("""
    import json, resource
    from jaxfid.runtime import host_memory
    decided = host_memory.tune_cpu_malloc()
    import jax, jax.numpy as jnp

    @jax.jit
    def f(x):
      y = jnp.sin(x)[::-1] + jnp.cos(x)
      return jnp.cumsum(y.reshape(64, -1), axis=0)[-1, :8]

    x = jnp.linspace(0, 1, 16_000_000, dtype=jnp.float32)
    faults = []
    for _ in range(40):
      before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
      f(x).block_until_ready()
      faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print(json.dumps({"decided": decided, "faults": faults}))
""")


def _faults(env_changes: dict) -> dict:
  env = {k: v for k, v in os.environ.items()
         if k not in host_memory.GLIBC_VARIABLES and k != host_memory.ENV_VAR}
  env.update(env_changes, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu",
             XLA_FLAGS="")  # one CPU device, whatever the test run sets
  out = subprocess.run([sys.executable, "-c", FAULTS_SCRIPT], env=env,
                       capture_output=True, text=True, timeout=300,
                       check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not GLIBC, reason="glibc malloc only")
def test_tuned_process_stops_faulting_in_its_step_buffers():
  tuned = _faults({})
  plain = _faults({host_memory.ENV_VAR: "0"})
  assert tuned["decided"] == {"cpu_malloc": True, "reason": "applied"}
  assert plain["decided"] == {"cpu_malloc": False,
                              "reason": "JAXFID_CPU_MALLOC turns it off"}
  # Untuned, the buffer is mmap-ed afresh every run (~31,000 faults);
  # tuned, the last 16 runs reuse the heap (a few may still grow it).
  last = slice(24, None)
  assert all(n > 20_000 for n in plain["faults"][last]), plain
  assert sum(n > 20_000 for n in tuned["faults"][last]) <= 4, tuned
  assert sum(n < 1_000 for n in tuned["faults"][last]) >= 12, tuned


@pytest.mark.parametrize("env, reason", [
    ({"JAXFID_CPU_MALLOC": "off"}, "JAXFID_CPU_MALLOC turns it off"),
    ({"MALLOC_ARENA_MAX": "4"}, "malloc set by the user (MALLOC_ARENA_MAX)"),
    ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"},
     "malloc set by the user (GLIBC_TUNABLES)"),
    ({"JAX_PLATFORMS": "cuda,cpu"}, "JAX_PLATFORMS=cuda,cpu"),
])
@pytest.mark.skipif(not GLIBC, reason="glibc malloc only")
def test_left_alone_when_the_user_or_platform_decides(env, reason):
  assert host_memory.why_not(env) == reason


@pytest.mark.skipif(not GLIBC, reason="glibc malloc only")
def test_not_after_jax_started_or_with_an_accelerator(monkeypatch):
  import jax.numpy as jnp
  jnp.zeros(1).block_until_ready()  # this process's backend is running
  assert host_memory.why_not({}) in (
      "JAX's backend has already started",
      "accelerator plugin "
      f"{(host_memory.accelerators_installed() or [None])[0]} installed")
  monkeypatch.setattr(host_memory, "_backend_started", lambda: False)
  monkeypatch.setattr(host_memory, "accelerators_installed",
                      lambda: ["jax_cuda12_plugin", "xla_rocm7"])
  assert host_memory.why_not({}) == (
      "accelerator plugin jax_cuda12_plugin installed")
  # JAX_PLATFORMS=cpu leaves the CUDA plugin out, not one of unknown kind
  assert host_memory.why_not({"JAX_PLATFORMS": "cpu"}) == (
      "accelerator plugin xla_rocm7 installed")
  monkeypatch.setattr(host_memory, "accelerators_installed",
                      lambda: ["jax_cuda12_plugin"])
  assert host_memory.why_not({"JAX_PLATFORMS": "cpu"}) is None


def test_cli_tunes_model_commands_only(monkeypatch, tmp_path, capsys):
  called = []
  monkeypatch.setattr(cli, "tune_cpu_malloc", lambda: called.append(1))
  missing = str(tmp_path / "missing")
  assert cli.main(["predict", "--checkpoint", missing, "--data", missing,
                   "--n-context", "1", "--text-maxlength", "8",
                   "--decode-maxlength", "4", "--output",
                   str(tmp_path / "p.jsonl")]) == 2
  assert called == [1]
  assert cli.main(["retrieve", "--index", missing, "--queries", missing,
                   "--top-k", "1", "--output", str(tmp_path / "r.json")]) == 2
  assert called == [1]
  capsys.readouterr()
