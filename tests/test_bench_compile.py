"""``jaxfid bench compile``: tiny FiD programs compiled for a TPU slice.

The compiles use the real TPU compiler (libtpu, on this CPU host) for
``v5e:2x2`` (4 chips); they are marked ``tpu`` and skip where libtpu is not
installed. The topology names and the one-line errors need no libtpu.
"""
import json
import resource
import signal
import subprocess
import sys
import threading
import time
import types

import gin
import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxfid import cli
from jaxfid.aot import command, programs, search, topologies
from jaxfid.core.errors import InputError
from jaxfid.fid import bench as fid_bench
from jaxfid.t5 import attention_ops

# gin/fid/tiny.gin at 1+1 layers and a 128-token vocabulary: seconds to
# compile, and parameters that dominate the arguments (the FSDP check)
TINY = ["--gin_file=gin/fid/tiny.gin", "--gin.config.T5Config.vocab_size=128",
        "--gin.config.T5Config.num_layers=1",
        "--gin.config.T5Config.num_decoder_layers=1", "--gin.BATCH_SIZE=8",
        "--gin.N_CONTEXT=2", "--gin.TEXT_MAXLENGTH=16",
        "--gin.ANSWER_MAXLENGTH=4"]
FIELDS = ("topology", "chips", "device_kind", "hbm_gb_per_chip", "mesh",
          "program", "argument_gb", "output_gb", "alias_gb", "temp_gb",
          "per_chip_gb", "fits", "flops_per_chip", "bytes_accessed_per_chip",
          "model_flops_per_chip", "program_flops_per_chip", "collectives",
          "roofline_step_s",
          "examples_per_sec_at_roofline", "compile_s")


@pytest.fixture(autouse=True)
def _clear_gin():
  yield
  gin.clear_config()


def _needs_libtpu():
  if not topologies.libtpu_available():
    pytest.skip("libtpu is not installed (pip install -e '.[tpu]')")


def _compile(capsys, *argv, topology="v5e:2x2") -> dict:
  assert cli.main(["bench", "compile", "--in-process", "--topology",
                   topology, *TINY, *argv]) == 0
  out = capsys.readouterr().out.strip().splitlines()
  return json.loads(out[-1])


def _consistent(r: dict, chips: int = 4) -> None:
  for key in FIELDS:
    assert key in r, key
  assert r["chips"] == chips and r["device_kind"] == "TPU v5 lite"
  assert r["hbm_gb_per_chip"] == pytest.approx(16 * 2 ** 30 / 1e9)
  assert r["per_chip_gb"] == pytest.approx(
      r["argument_gb"] + r["output_gb"] - r["alias_gb"] + r["temp_gb"]
      + r["generated_code_gb"])
  assert r["fits"] == (r["per_chip_gb"] <= r["hbm_gb_per_chip"])
  chip = topologies.CHIPS["v5e"]
  # the compiler counts a loop's body once; the program's FLOPs every trip,
  # and its bytes as many times
  trips = max(1.0, r["program_flops_per_chip"] / r["flops_per_chip"])
  assert r["roofline_step_s"] == pytest.approx(max(
      max(r["flops_per_chip"], r["program_flops_per_chip"])
      / chip.peak_bf16_flops,
      r["bytes_accessed_per_chip"] * trips / chip.hbm_bytes_per_s))
  assert r["examples_per_sec_at_roofline"] == pytest.approx(
      r["batch_size"] / r["roofline_step_s"])
  assert set(r["collectives"]) == set(programs.COLLECTIVES)
  assert r["flops_per_chip"] > 0 and r["model_flops_per_chip"] > 0
  assert r["compile_s"] > 0


# ---- no libtpu needed --------------------------------------------------------

def test_accelerator_type_names_map_to_slices():
  expect = {"v4-32": ("v4:2x2x4", 16), "v4-8": ("v4:2x2x1", 4),
            "v5p-64": ("v5p:2x4x4", 32), "v5e-16": ("v5e:4x4", 16),
            "v5litepod-16": ("v5e:4x4", 16), "v6e-8": ("v6e:2x4", 8),
            "v5e:2x2": ("v5e:2x2", 4), "V5E-32": ("v5e:4x8", 32)}
  for name, (libtpu_name, chips) in expect.items():
    t = topologies.parse(name)
    assert (t.libtpu_name, t.chips) == (libtpu_name, chips), name
  assert topologies.parse("v5e-16", slices=2).chips == 32
  assert topologies.parse("v4-32").chip_config == "megacore"
  assert topologies.parse("v5e-16").host_bounds == (2, 2, 1)
  for bad in ("v5e-3", "v4-7", "v7-8", "tpu", "v5e:2x2x2", "v4:4x4"):
    with pytest.raises(InputError, match="unknown TPU topology"):
      topologies.parse(bad)
  with pytest.raises(InputError, match="--slices: must be at least 1"):
    topologies.parse("v5e-16", slices=0)


def test_search_splits_the_chips():
  assert search.splits(16) == ["data=16", "fsdp=16", "fsdp=8,model=2",
                                     "fsdp=4,model=4"]
  assert search.splits(2) == ["data=2", "fsdp=2"]
  assert search._flag("REMAT", "dots") == "--gin.REMAT=\"'dots'\""
  assert search._flag("SCAN_LAYERS", True) == "--gin.SCAN_LAYERS=True"


def _made_up_run(batch: int, chips: int):
  """``(built, target)`` as the search reads them: a run of ``batch``
  examples (full remat, no mesh) and ``chips`` v5e chips."""
  settings = types.SimpleNamespace(batch_size=batch, mesh="",
                                   accumulation_steps=1)
  built = types.SimpleNamespace(settings=settings, remat="full",
                                scan_layers=False)
  target = types.SimpleNamespace(
      devices=[0] * chips, topology=types.SimpleNamespace(name=f"v5e-{chips}"),
      chip=topologies.CHIPS["v5e"])
  return built, target


def test_search_ranks_what_fits_and_runs_splits_side_by_side(capsys):
  """The search's policy on a made-up compiler (no libtpu): per split the
  lightest remat that fits, the scan flip shown unranked, a crashed compile
  its own row; ``jobs=2`` runs two splits' compiles at once."""
  running, most = [0], [0]
  lock = threading.Lock()
  # the first compile waits (60 s at most) for a second to run beside it,
  # which jobs=2 starts whatever the host's speed (and jobs=1 never)
  side_by_side, gave_up = threading.Event(), threading.Event()

  def compile_fn(macros, flops):
    with lock:
      running[0] += 1
      most[0] = max(most[0], running[0])
      if running[0] == 2:
        side_by_side.set()
    if not gave_up.is_set() and not side_by_side.wait(timeout=60):
      gave_up.set()
    with lock:
      running[0] -= 1
    if macros["MESH"] == "fsdp=2,model=2":
      raise search.CompileFailed("the compile was killed by SIGSEGV")
    need = {"none": 30.0, "dots": 12.0, "full": 8.0}[macros["REMAT"]]
    need -= 1.0 if macros["MESH"].startswith("fsdp") else 0.0
    step = {"none": 1.0, "dots": 1.1, "full": 1.3}[macros["REMAT"]]
    step -= 0.05 if macros["MESH"].startswith("fsdp") else 0.0
    return {"fits": need <= 16.0, "per_chip_gb": need,
            "roofline_step_s": step + (0.01 if macros["SCAN_LAYERS"] else 0),
            "examples_per_sec_at_roofline": 8 / step}

  r = search.search(compile_fn, lambda: [1.0], *_made_up_run(8, 4),
                    "train", jobs=2)
  assert most[0] == 2
  tried = {(row["MESH"], row["REMAT"]) for row in r["search"]}
  # the third split starts at the lightest remat found so far (dots)
  assert tried == {("data=4", "none"), ("data=4", "dots"), ("fsdp=4", "none"),
                   ("fsdp=4", "dots"), ("fsdp=2,model=2", "dots"),
                   ("fsdp=2,model=2", "full")}
  assert r["flags"] == ["--gin.REMAT=\"'dots'\"", "--gin.MESH=\"'fsdp=4'\""]
  assert r["roofline_step_s"] == pytest.approx(1.05) and r["fits"]
  assert r["compiles"] == 5  # a crash is a row, not a compile
  assert r["search"][-1]["ranked"] is False
  assert "killed by SIGSEGV" in capsys.readouterr().err


def test_search_starts_later_splits_at_the_lightest_remat_found():
  """Splits after the first start at the lightest remat that fitted so far
  and walk down while they fit, or up until one fits: the same answer as
  walking up from ``none`` on every split, in fewer compiles where only
  ``full`` fits (paper sizes)."""
  need = {("data=8", "none"): 40.0, ("data=8", "dots"): 20.0,
          ("data=8", "full"): 12.0, ("fsdp=8", "none"): 30.0,
          ("fsdp=8", "dots"): 15.0, ("fsdp=8", "full"): 9.0,
          ("fsdp=4,model=2", "none"): 35.0, ("fsdp=4,model=2", "dots"): 18.0,
          ("fsdp=4,model=2", "full"): 11.0, ("fsdp=2,model=4", "none"): 36.0,
          ("fsdp=2,model=4", "dots"): 19.0, ("fsdp=2,model=4", "full"): 17.0}
  order = []

  def compile_fn(macros, flops):
    key = (macros["MESH"], macros["REMAT"])
    order.append(key)
    step = {"none": 1.0, "dots": 1.1, "full": 1.3}[macros["REMAT"]]
    return {"fits": need[key] <= 16.0, "per_chip_gb": need[key],
            "roofline_step_s": step, "examples_per_sec_at_roofline": 8 / step}

  r = search.search(compile_fn, lambda: [1.0], *_made_up_run(16, 8),
                    "train")
  assert order[:-1] == [
      ("data=8", "none"), ("data=8", "dots"), ("data=8", "full"),
      ("fsdp=8", "full"), ("fsdp=8", "dots"), ("fsdp=8", "none"),  # lighter
      ("fsdp=4,model=2", "dots"), ("fsdp=4,model=2", "full"),
      ("fsdp=2,model=4", "dots"), ("fsdp=2,model=4", "full")]  # none fits
  assert order[-1] == ("fsdp=8", "dots")  # the scan flip of the best
  assert r["flags"] == ["--gin.REMAT=\"'dots'\"", "--gin.MESH=\"'fsdp=8'\""]


def test_out_of_memory_messages_are_parsed():
  used = programs.out_of_memory(RuntimeError(
      "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of "
      "memory in memory space hbm. Used 24.10G of 15.75G hbm. Exceeded hbm "
      "capacity by 8.35G.\n\nTotal hbm usage >= 24.35G:"))
  assert used.required_bytes == int(24.10 * 2 ** 30)
  assert not used.temporaries_only
  temps = programs.out_of_memory(RuntimeError(
      "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory "
      "required for HLO temporaries (16.00G) exceeds available HBM (15.75G)."))
  assert temps.required_bytes == 16 * 2 ** 30 and temps.temporaries_only
  assert programs.out_of_memory(RuntimeError("INVALID_ARGUMENT: bad")) is None


def test_hlo_collectives_are_counted_once_each():
  hlo = """
  %ag = bf16[8] all-gather(bf16[2] %p), dimensions={0}
  %ags = (bf16[2], bf16[8]) all-gather-start(bf16[2] %q), dimensions={0}
  %agd = bf16[8] all-gather-done((bf16[2], bf16[8]) %ags)
  %rs = f32[2] reduce-scatter(f32[8] %g), dimensions={0}
  %ar = f32[] all-reduce(f32[] %l), to_apply=%add
  %cp = f32[2] collective-permute(f32[2] %x), source_target_pairs={{0,1}}
}

%all-reduce-scatter.3 (input_0: bf16[8,4]) -> (bf16[2,4]) {
  %input_0 = bf16[8,4]{1,0} parameter(0)
  %all-reduce.7 = (bf16[8,4]{1,0}) all-reduce(%input_0), to_apply=%add
  ROOT %tuple = (bf16[2,4]) tuple(%dynamic-slice.1)
}

ENTRY %main.1 (p: bf16[8,4]) -> bf16[2,4] {
  %fusion.1 = (bf16[2,4]) fusion(%p), kind=kCustom, calls=%all-reduce-scatter.3
  %ar2 = f32[] all-reduce(f32[] %m), to_apply=%add
  """
  assert programs.count_collectives(hlo) == {
      "all-gather": 2, "reduce-scatter": 2, "all-reduce": 2, "all-to-all": 0,
      "collective-permute": 1}


def test_an_unknown_topology_is_one_line(capsys):
  assert cli.main(["bench", "compile", "--topology", "v5e-3", *TINY]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err == [
      "jaxfid bench: error: --topology: unknown TPU topology 'v5e-3': "
      f"expected {topologies.KNOWN_FORMS}"]


def test_a_missing_libtpu_is_one_line(capsys, monkeypatch):
  monkeypatch.setitem(sys.modules, "libtpu", None)  # as if not installed
  assert cli.main(["bench", "compile", "--topology", "v5e-16", *TINY]) == 2
  captured = capsys.readouterr()
  assert captured.out == ""
  assert captured.err.strip().splitlines() == [
      "jaxfid bench: error: --topology: compiling for a TPU needs libtpu: "
      "pip install -e '.[tpu]' (works on a CPU host)"]


# ---- compiled for v5e:2x2 ----------------------------------------------------

@pytest.mark.tpu
def test_fsdp_cuts_the_arguments_per_chip_4x(capsys):
  _needs_libtpu()
  data = _compile(capsys, "--gin.MESH='data=4'")
  gin.clear_config()
  fsdp = _compile(capsys, "--gin.MESH='fsdp=4'")
  for r, mesh in ((data, {"data": 4, "fsdp": 1, "model": 1}),
                  (fsdp, {"data": 1, "fsdp": 4, "model": 1})):
    _consistent(r)
    assert r["mesh"] == mesh and r["program"] == "train" and r["fits"]
    assert r["topology"] == "v5e:2x2" and r["phase"] == "train"
  assert 3.5 < data["argument_gb"] / fsdp["argument_gb"] < 4.5
  # the same model: the same analytic FLOPs, split over the same chips
  assert data["model_flops_per_chip"] == fsdp["model_flops_per_chip"]
  assert fsdp["collectives"]["all-gather"] > data["collectives"]["all-gather"]


@pytest.mark.parametrize("gin_file", ["gin/fid/base.gin", "gin/fid/large.gin",
                                      "gin/fid/two_phase.gin",
                                      "gin/fid/fido_base.gin"])
def test_shipped_fid_files_build_their_shapes_without_data(gin_file, capsys):
  """What bench compile builds from a training gin file without MODEL_DIR
  or TRAIN_DATA: the paper's batch (two-phase: its larger passage count);
  TARGET_MAXLENGTH None compiles the decoding bound's targets, said once."""
  run = command.Run((gin_file,), (), ())
  base = run.placeholders()
  assert set(base) == {"MODEL_DIR", "TRAIN_DATA"}
  run.check(base)
  built = run.build(base)
  batch = built.task.abstract_batch(built.prepared, 0)
  assert batch["encoder_input_tokens"].shape == (64, 100, 250)
  assert batch["passage_mask"].shape == (64, 100)
  assert batch["decoder_target_tokens"].shape == (64, 49)
  fn, decode = built.task.decode_program(built.prepared, 8)
  assert decode["encoder_input_tokens"].shape == (8, 100, 250)
  assert "TARGET_MAXLENGTH None: compiled with targets of 49 tokens" in (
      capsys.readouterr().err)


def test_model_flops_are_the_models_without_recomputation():
  """The train step's traced matmul FLOPs are 3x the analytic forward pass
  (forward, and backward's two), whatever remat, accumulation and scanning
  do; decoding's are the forward pass over its tokens."""
  for extra in (("REMAT='full'", "ACCUMULATION_STEPS=2"),
                ("SCAN_LAYERS=True", "config.T5Config.num_layers=3")):
    run = command.Run(("gin/fid/tiny.gin",), (
        "BATCH_SIZE=4", "N_CONTEXT=3", "TEXT_MAXLENGTH=16",
        "ANSWER_MAXLENGTH=5", *extra), ())
    base = run.placeholders()
    built = run.build(base)
    shape = fid_bench.Shape(4, 3, 16, 5)
    forward = fid_bench.forward_flops(built.task.model_config, shape)
    assert command.train_model_flops(run, base) == [3 * forward]
    fn, batch = built.task.decode_program(built.prepared, 4)
    assert programs.program_flops(fn, built.prepared.model.abstract_params(),
                             batch) == fid_bench.forward_flops(
                                 built.task.model_config, shape,
                                 decoded_tokens=5)


def test_program_flops_count_kernels_and_shard_maps_whole():
  """A Pallas kernel counts what it does over its whole grid (not one grid
  step's body), and a shard_map body counts once per shard: the fused
  attention's FLOPs are the einsum attention's, on one device or many."""
  b, l, h, e = 64, 256, 4, 64  # several passages' blocks: a grid of many
  q = jax.ShapeDtypeStruct((b, l, h, e), jnp.float32)
  bias = jnp.zeros((1, h, l, l), jnp.float32)
  mask = jnp.ones((b, 1, 1, l), bool)

  def attend(kind):
    return lambda q: attention_ops.attend(
        q, q, q, bias=bias, mask=mask, rate=0.0, rng=None,
        implementation=kind)[0]

  want = programs.program_flops(attend("reference"), q)
  assert want == 2 * 2 * b * h * l * l * e
  assert programs.program_flops(attend("pallas"), q) == want
  mesh = jax.make_mesh((4,), ("data",))
  split = jax.ShapeDtypeStruct((8, 16), jnp.float32,
                               sharding=NamedSharding(mesh, P("data")))
  with jax.set_mesh(mesh):
    flops = programs.program_flops(lambda x: jax.shard_map(
        lambda a: a @ a.T, mesh=mesh, in_specs=P("data"), out_specs=P("data"),
        check_vma=False)(x), split)
  assert flops == 2 * 8 * 16 * 2  # four shards of [2, 16] @ [16, 2]


def test_a_loops_bytes_count_as_often_as_its_flops():
  """The compiler's cost analysis counts a loop's body once (four
  microbatches: one); the roofline's bytes are scaled by the ratio of the
  program's FLOPs to the compiler's, never below 1."""
  assert programs.loop_trips(91.3e12, 4 * 91.3e12) == pytest.approx(4)
  assert programs.loop_trips(78.8e12, 62.5e12) == 1.0   # no loop: elementwise ops
  assert programs.loop_trips(0.0, 5.0) == 1.0


def test_a_search_compile_that_crashes_is_its_row(monkeypatch):
  """--search compiles each configuration in a child process: one killed
  by a compiler crash, or exiting with an error, is one line of its own."""
  args = cli.build_parser().parse_args(
      ["bench", "compile", "--topology", "v5e-4", "--gin_file=x.gin"])
  args.gin_bindings = ["BATCH_SIZE=8"]
  seen = []

  def crashed(argv, **_):
    seen.append(argv)
    return subprocess.CompletedProcess(argv, -signal.SIGSEGV, "", "")
  monkeypatch.setattr(subprocess, "run", crashed)
  with pytest.raises(search.CompileFailed, match="killed by SIGSEGV"):
    command.compile_in_child(args, {"REMAT": "full"}, [1.0])
  assert seen[0][-3:] == ["--gin.BATCH_SIZE=8", "--gin.REMAT='full'",
                          "--model-flops=[1.0]"]
  monkeypatch.setattr(subprocess, "run", lambda argv, **_: (
      subprocess.CompletedProcess(argv, 2, "", "note\njaxfid bench: error: "
                                  "MESH: cannot lay out\n")))
  with pytest.raises(search.CompileFailed) as e:
    command.compile_in_child(args, {}, None)
  assert e.value.message == "MESH: cannot lay out"


def test_the_compile_process_gets_the_largest_stack_allowed(monkeypatch):
  """The child compiles with the stack limit raised to its ceiling (the
  TPU compiler's recursion overflowed 8 MiB thread stacks on a 48-layer
  program: command.CHILD_START), and this process's stays as it
  was."""
  soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
  low = 4 << 20 if hard == resource.RLIM_INFINITY else min(hard, 4 << 20)
  if low == hard:
    pytest.skip("the host's stack ceiling is 4 MiB or less: nothing to raise")
  args = cli.build_parser().parse_args(
      ["bench", "compile", "--topology", "v5e-4", "--gin_file=x.gin"])
  args.gin_bindings = []
  spawn = subprocess.run

  def probe(argv, **kwargs):   # the child reports the limits it runs with
    start = argv.index("-m")   # the interpreter, CHILD_START and its pid
    return spawn(argv[:start] + [
        "-c", "import json, resource; "
        "print(json.dumps(resource.getrlimit(resource.RLIMIT_STACK)))"],
        **kwargs)
  monkeypatch.setattr(subprocess, "run", probe)
  resource.setrlimit(resource.RLIMIT_STACK, (low, hard))  # `ulimit -s 4096`
  try:
    got = command.compile_in_child(args, {}, None)
    assert resource.getrlimit(resource.RLIMIT_STACK) == (low, hard)
  finally:
    resource.setrlimit(resource.RLIMIT_STACK, (soft, hard))
  assert got == [hard, hard]


def _running(pid: int) -> bool:
  """The process exists and is not a zombie waiting to be reaped."""
  try:
    with open(f"/proc/{pid}/status") as f:
      return not any(line.startswith("State:") and "Z" in line for line in f)
  except FileNotFoundError:
    return False


@pytest.mark.skipif(sys.platform != "linux",
                    reason="PR_SET_PDEATHSIG is Linux's")
def test_the_compile_process_dies_with_its_parent(tmp_path):
  """A search killed on its own (``kill -9``) takes its compile with it
  instead of leaving it running (command.CHILD_START)."""
  pid_file = tmp_path / "child.pid"
  sleeper = (f"import os, time; open({str(pid_file)!r}, 'w')"
             ".write(str(os.getpid())); time.sleep(120)")
  parent = subprocess.Popen([sys.executable, "-c", (
      "import os, subprocess, sys\n"
      "from jaxfid.aot import command\n"
      "subprocess.run([sys.executable, '-c', command.CHILD_START, "
      f"str(os.getpid()), '-c', {sleeper!r}])\n")])
  try:
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
      assert time.monotonic() < deadline and parent.poll() is None
      time.sleep(0.1)
    child = int(pid_file.read_text())
    assert _running(child)
  finally:
    parent.kill()
    parent.wait()
  deadline = time.monotonic() + 60  # SIGKILL is prompt; a loaded host is not
  while _running(child) and time.monotonic() < deadline:
    time.sleep(0.1)
  assert not _running(child), f"compile process {child} outlived its parent"


def test_sigterm_says_its_line_while_stderr_is_captured():
  """SIGTERM during a build, whose notes ``Run.build`` captures, still
  says the one line."""
  proc = subprocess.run([sys.executable, "-c", (
      "import contextlib, io, os, signal\n"
      "from jaxfid.aot import command\n"
      "with command._sigterm_is_one_line('log.jsonl'):\n"
      "  with contextlib.redirect_stderr(io.StringIO()):\n"
      "    os.kill(os.getpid(), signal.SIGTERM)\n"
      "    signal.pause()\n")], capture_output=True, text=True, timeout=300)
  assert proc.returncode == -signal.SIGTERM, proc
  assert proc.stderr == ("jaxfid bench compile: stopped by SIGTERM; rerun "
                         "with --search-log log.jsonl to go on\n"), proc


@pytest.mark.tpu
def test_sigterm_stops_a_search_with_one_line(tmp_path):
  """libtpu's failure-signal handler would answer SIGTERM with a stack dump;
  a stopped search says one line and dies of SIGTERM. Each wait is bounded
  and a failure shows what the process printed."""
  _needs_libtpu()
  log = tmp_path / "search.jsonl"
  proc = subprocess.Popen(
      [sys.executable, "-m", "jaxfid", "bench", "compile", "--topology",
       "v5e:2x2", *TINY, "--search", f"--search-log={log}"],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    # The table's header is printed once the handler is in place (libtpu,
    # whose own handler it replaces, is loaded before it).
    first: list[str] = []
    reader = threading.Thread(
        target=lambda: first.append(proc.stderr.readline()), daemon=True)
    reader.start()
    reader.join(timeout=600)
    if not first:
      proc.kill()
      pytest.fail("no table header within 600 s; stderr:\n"
                  + proc.communicate()[1])
    header = first[0]
    assert header.startswith("REMAT"), header + proc.stderr.read()
    proc.send_signal(signal.SIGTERM)
    try:
      out, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
      proc.kill()
      out, err = proc.communicate()
      pytest.fail(f"still running 300 s after SIGTERM (exit "
                  f"{proc.returncode}); stdout {out!r}, stderr:\n{err}")
  finally:
    proc.kill()
  assert proc.returncode == -signal.SIGTERM, (proc.returncode, out, err)
  assert out == ""
  lines = err.splitlines()
  assert lines and lines[-1] == (
      "jaxfid bench compile: stopped by SIGTERM; rerun "
      f"with --search-log {log} to go on"), err
  assert all(line.startswith(("none ", "dots ", "full ")) for line in
             lines[:-1]), err  # at most the rows finished before it


@pytest.mark.tpu
def test_a_compiler_crash_is_one_line(capsys, monkeypatch):
  """The compile runs in a process of its own: libtpu dying of a signal
  there is one line and exit status 1, not a crash of the command."""
  _needs_libtpu()
  monkeypatch.setattr(subprocess, "run", lambda argv, **_: (
      subprocess.CompletedProcess(argv, -signal.SIGSEGV, "", "")))
  assert cli.main(["bench", "compile", "--topology", "v5e:2x2", *TINY]) == 1
  captured = capsys.readouterr()
  assert captured.out == ""
  assert captured.err.strip() == (
      "jaxfid bench: error: the compile was killed by SIGSEGV (a compiler "
      "crash, or the host's memory)")


@pytest.mark.tpu
@pytest.mark.slow
def test_a_scanned_step_counts_every_layer(capsys):
  """The compiler's cost analysis counts a scanned layer once; the report's
  roofline counts the program's FLOPs, every layer (_consistent)."""
  _needs_libtpu()
  r = _compile(capsys, "--gin.SCAN_LAYERS=True",
               "--gin.config.T5Config.num_layers=4")
  _consistent(r)
  assert r["flops_per_chip"] < r["program_flops_per_chip"]
  assert r["roofline_step_s"] >= (r["program_flops_per_chip"]
                                  / topologies.CHIPS["v5e"].peak_bf16_flops)


@pytest.mark.tpu
@pytest.mark.slow
def test_passage_encodings_compile_to_the_same_model(capsys):
  """FiD's encoder flattened to [B*P, L] or vmapped over P
  (``PASSAGE_ENCODING``, jaxfid/t5/passages.py): the same matmuls (model
  FLOPs) in both train steps, on the same parameters (docs/fidelity.md
  compares the compiler's counts and memory at t5-base width)."""
  _needs_libtpu()
  flat, vmap = (_compile(capsys, f"--gin.PASSAGE_ENCODING='{mode}'")
                for mode in ("flatten", "vmap"))
  for r in (flat, vmap):
    _consistent(r)
    assert r["fits"]
  assert vmap["model_flops_per_chip"] == flat["model_flops_per_chip"]
  assert vmap["argument_gb"] == flat["argument_gb"]  # the same parameters


@pytest.mark.tpu
def test_decode_program_compiles_reading_and_writing_nothing(capsys,
                                                             tmp_path):
  _needs_libtpu()
  r = _compile(capsys, "--program", "decode", "--gin.EVAL_BATCH_SIZE=6",
               f"--gin.TRAIN_DATA='{tmp_path / 'absent.json'}'",
               f"--gin.MODEL_DIR='{tmp_path / 'run'}'")
  assert list(tmp_path.iterdir()) == []
  _consistent(r)
  assert r["program"] == "decode" and r["fits"]
  assert r["batch_size"] == 8  # 6 rounded up over the 4 data-parallel chips
  assert r["alias_gb"] == 0  # nothing donated


@pytest.mark.tpu
@pytest.mark.slow
def test_a_batch_too_large_does_not_fit(capsys):
  _needs_libtpu()
  r = _compile(capsys, "--gin.MESH='data=4'", "--gin.BATCH_SIZE=512",
               "--gin.N_CONTEXT=8", "--gin.TEXT_MAXLENGTH=1024")
  captured = capsys.readouterr()
  assert "Traceback" not in captured.err
  assert r["fits"] is False
  assert r["required_gb"] > r["hbm_gb_per_chip"]
  assert "RESOURCE_EXHAUSTED" in r["compiler_message"]
  assert set(FIELDS) <= set(r) and r["per_chip_gb"] is None
  assert 0 < r["argument_gb"] < r["required_gb"]


@pytest.mark.tpu
@pytest.mark.slow
def test_search_finds_a_fitting_best_with_flags(capsys):
  _needs_libtpu()
  r = _compile(capsys, "--search", topology="v5e-2")  # 2 chips: 3 compiles
  assert r["fits"] is True and r["compiles"] == len(r["search"]) == 3
  assert {row["MESH"] for row in r["search"]} == {"data=2", "fsdp=2"}
  assert r["chips"] == 2 and r["topology"] == "v5e-2"
  fitting = [row for row in r["search"]
             if row.get("fits") and row.get("ranked", True)]
  assert r["roofline_step_s"] == min(row["roofline_step_s"]
                                     for row in fitting)
  # the last compile flips SCAN_LAYERS on the best: shown, not ranked
  assert r["search"][-1]["ranked"] is False
  assert r["search"][-1]["SCAN_LAYERS"] is True
  assert all(f.startswith("--gin.") for f in r["flags"])
  # a tiny model fits without remat: REMAT='none' on every split tried
  assert {row["REMAT"] for row in r["search"]} == {"none"}


# Every method's tiny gin file, as a user would size it: no data given (the
# tasks bind placeholders), only what the shapes need (ReAtt's
# TARGET_MAXLENGTH, ReFusion's TASK and DB_DIM).
METHODS = {
    "reatt": ["--gin_file=gin/reatt/tiny.gin", "--gin.TARGET_MAXLENGTH=4"],
    "refusion": ["--gin_file=gin/refusion/tiny.gin", "--gin.TASK='sst-2'",
                 "--gin.DB_DIM=16"],
    "dual_encoder": ["--gin_file=gin/retrieval/dual_encoder_tiny.gin"],
    "distill": ["--gin_file=gin/retrieval/distill_tiny.gin"],
}


@pytest.mark.tpu
@pytest.mark.slow  # FiD's programs compile in the fast tier
@pytest.mark.parametrize("program", ["train", "decode"])
@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_compiles_both_programs(method, program, capsys):
  _needs_libtpu()
  assert cli.main(["bench", "compile", "--in-process", "--topology",
                   "v5e:2x2", *METHODS[method], "--program", program]) == 0
  r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  _consistent(r)
  assert r["program"] == program and r["fits"]


@pytest.mark.tpu
@pytest.mark.slow
def test_search_sizes_reatt_with_grad_cache(capsys):
  """--search over ReAtt's GradCache step (in-batch negatives over 2
  microbatches, as gin/reatt/large.gin's 4): every row keeps the run's
  accumulation, and the best fits with its flags."""
  _needs_libtpu()
  assert cli.main(["bench", "compile", "--topology", "v5e-2",
                   *METHODS["reatt"], "--gin.IN_BATCH_NEGATIVES=True",
                   "--gin.ACCUMULATION_STEPS=2", "--search"]) == 0
  r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert r["fits"] is True and r["chips"] == 2
  assert r["compiles"] == len(r["search"]) == 3
  assert {row["MESH"] for row in r["search"]} == {"data=2", "fsdp=2"}
  assert {row["ACCUMULATION_STEPS"] for row in r["search"]} == {2}
  assert all("error" not in row for row in r["search"])
  assert r["search"][-1]["SCAN_LAYERS"] is True
  assert all(f.startswith("--gin.") for f in r["flags"])
