"""jaxfid.runtime.compilation_cache: where the persistent compilation cache goes, and when not."""
import os
import subprocess
import sys
import textwrap

import jax
import pytest

from jaxfid.runtime import compilation_cache as runtime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def restore_cache_config():
  """Leave JAX's cache settings and the module's memory as they were."""
  saved = (jax.config.jax_compilation_cache_dir,
           jax.config.jax_persistent_cache_min_compile_time_secs,
           runtime._applied_dir)
  yield
  jax.config.update("jax_compilation_cache_dir", saved[0])
  jax.config.update("jax_persistent_cache_min_compile_time_secs", saved[1])
  runtime._applied_dir = saved[2]


def test_cache_dir_from_environment(tmp_path):
  assert runtime.compilation_cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == (
      os.path.join(str(tmp_path), "jaxfid", "xla"))
  for off in ("0", "off", "OFF", "false", "no", "", "  "):
    assert runtime.compilation_cache_dir(
        {runtime.ENV_VAR: off}) is None, off
  assert runtime.compilation_cache_dir(
      {runtime.ENV_VAR: str(tmp_path / "c")}) == str(tmp_path / "c")


def test_single_process_turns_the_cache_on_then_off(tmp_path,
                                                    restore_cache_config):
  jax.config.update("jax_compilation_cache_dir", None)
  runtime._applied_dir = None
  env = {runtime.ENV_VAR: str(tmp_path / "xla")}
  decided = runtime.apply_runtime_defaults(env)
  assert decided == {"compilation_cache": str(tmp_path / "xla"),
                     "reason": "single process"}
  assert jax.config.jax_compilation_cache_dir == str(tmp_path / "xla")
  assert os.path.isdir(tmp_path / "xla")
  # Called again once the run is known to be multi-process: ours goes off.
  decided = runtime.apply_runtime_defaults(
      {**env, "JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"})
  assert decided["compilation_cache"] is None
  assert not jax.config.jax_compilation_cache_dir
  runtime.apply_runtime_defaults(env)
  assert runtime.apply_runtime_defaults(
      {runtime.ENV_VAR: "0"})["compilation_cache"] is None
  assert not jax.config.jax_compilation_cache_dir


def test_several_processes_get_no_cache(tmp_path, monkeypatch,
                                        restore_cache_config):
  jax.config.update("jax_compilation_cache_dir", None)
  runtime._applied_dir = None
  assert runtime.process_count_without_backend() == 1
  monkeypatch.setattr(runtime, "process_count_without_backend", lambda: 2)
  decided = runtime.apply_runtime_defaults({runtime.ENV_VAR: str(tmp_path)})
  assert decided["compilation_cache"] is None
  assert "multi-process" in decided["reason"]
  assert not jax.config.jax_compilation_cache_dir


def test_a_cache_the_user_gave_jax_is_left_alone(tmp_path,
                                                 restore_cache_config):
  runtime._applied_dir = None
  jax.config.update("jax_compilation_cache_dir", str(tmp_path / "mine"))
  decided = runtime.apply_runtime_defaults(
      {runtime.ENV_VAR: str(tmp_path / "ours"), "JAX_COORDINATOR_ADDRESS": "x"})
  assert decided == {"compilation_cache": str(tmp_path / "mine"),
                     "reason": "set by the user for JAX"}
  assert jax.config.jax_compilation_cache_dir == str(tmp_path / "mine")


def test_a_second_process_loads_the_compiled_program(tmp_path):
  """End to end in fresh processes: the first writes an entry, the second
  finds it (JAX logs a cache hit) instead of compiling."""
  script = textwrap.dedent("""
      import logging, jax, jax.numpy as jnp
      from jaxfid.runtime import compilation_cache as runtime
      print(runtime.apply_runtime_defaults())
      jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
      logging.basicConfig(level=logging.DEBUG)
      f = jax.jit(lambda x: jnp.tanh(x @ x.T).sum())
      print(float(f(jnp.ones((4, 3)))))
  """)
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu",
             **{runtime.ENV_VAR: str(tmp_path / "xla")})
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  runs = [subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
          for _ in range(2)]
  for r in runs:
    assert r.returncode == 0, r.stderr[-2000:]
  assert os.listdir(tmp_path / "xla")
  assert "Persistent compilation cache hit" not in runs[0].stderr
  assert "Persistent compilation cache hit" in runs[1].stderr
