"""``jaxfid bench compile --breakdown``: where a step's bytes and FLOPs go.

The parser is checked on a small handwritten HLO module (every count known
by hand) and on tiny FiD programs compiled by libtpu for ``v5e:2x2``
(marked ``tpu``; skipped without libtpu).
"""
import json
import subprocess

import gin
import pytest

from jaxfid import cli
from jaxfid.aot import breakdown, command, topologies

# An entry computation (batch 2, 3 heads, 5 x 5 scores) with: a matmul
# fusion, a score fusion (its dot named `...->bhls`), the gradient of the
# score einsum (a query-shaped output), a layout copy, an offload to host
# memory (S(5)), an asynchronous slice into on-chip memory, a dropout mask
# (pred), an on-chip (S(1)) output, an all-reduce, and a while loop of known trip count 4 whose body slices a
# stacked weight in a fusion.
HLO = """\
HloModule jit_train_step, entry_computation_layout={(f32[2,5,8]{2,1,0})->f32[]}

%fused_dot (param_0.1: bf16[2,5,8], param_1.1: bf16[8,16]) -> bf16[2,5,16] {
  %param_0.1 = bf16[2,5,8]{2,1,0} parameter(0)
  %param_1.1 = bf16[8,16]{1,0} parameter(1)
  ROOT %dot.1 = bf16[2,5,16]{2,1,0} dot(%param_0.1, %param_1.1), lhs_contracting_dims={2}, rhs_contracting_dims={0}, metadata={op_name="jit(train_step)/jvp(...d,df->...f)/dot_general"}
}

%fused_scores (param_0.2: bf16[2,5,3,4], param_1.2: bf16[2,5,3,4]) -> f32[2,3,5,5] {
  %param_0.2 = bf16[2,5,3,4]{3,2,1,0} parameter(0)
  %param_1.2 = bf16[2,5,3,4]{3,2,1,0} parameter(1)
  ROOT %convolution.2 = f32[2,3,5,5]{3,2,1,0} convolution(%param_0.2, %param_1.2), window={size=2x3 stride=1x2 lhs_dilate=2x3}, dim_labels=0b1f_0o1i->01bf, metadata={op_name="jit(train_step)/jvp(blhe,bshe->bhls)/dot_general"}
}

%fused_dq (param_0.5: f32[2,3,5,5], param_1.5: bf16[2,5,3,4]) -> bf16[2,5,3,4] {
  %param_0.5 = f32[2,3,5,5]{3,2,1,0} parameter(0)
  %param_1.5 = bf16[2,5,3,4]{3,2,1,0} parameter(1)
  ROOT %dot.5 = bf16[2,5,3,4]{3,2,1,0} dot(%param_0.5, %param_1.5), lhs_batch_dims={0,1}, lhs_contracting_dims={3}, rhs_batch_dims={0,2}, rhs_contracting_dims={1}, metadata={op_name="jit(train_step)/transpose(jvp(blhe,bshe->bhls))/dot_general"}
}

%fused_copy (param_0.3: f32[2,3,5,5]) -> f32[2,5,3,5] {
  %param_0.3 = f32[2,3,5,5]{3,2,1,0} parameter(0)
  ROOT %transpose.3 = f32[2,5,3,5]{3,2,1,0} transpose(%param_0.3), dimensions={0,2,1,3}
}

%fused_slice (param_0.4: f32[4,8,16], param_1.4: s32[]) -> f32[1,8,16] {
  %param_0.4 = f32[4,8,16]{2,1,0} parameter(0)
  %param_1.4 = s32[] parameter(1)
  %constant.4 = s32[] constant(0)
  ROOT %dynamic-slice.4 = f32[1,8,16]{2,1,0} dynamic-slice(%param_0.4, %param_1.4, %constant.4, %constant.4), dynamic_slice_sizes={1,8,16}
}

%body (loop.1: (s32[], f32[4,8,16])) -> (s32[], f32[4,8,16]) {
  %loop.1 = (s32[], f32[4,8,16]{2,1,0}) parameter(0)
  %i.1 = s32[] get-tuple-element(%loop.1), index=0
  %w.1 = f32[4,8,16]{2,1,0} get-tuple-element(%loop.1), index=1
  %layer.1 = f32[1,8,16]{2,1,0} fusion(%w.1, %i.1), kind=kLoop, calls=%fused_slice, metadata={op_name="jit(train_step)/jvp(while)/body/dynamic_slice"}
  ROOT %tuple.1 = (s32[], f32[4,8,16]{2,1,0}) tuple(%i.1, %w.1)
}

%cond (loop.2: (s32[], f32[4,8,16])) -> pred[] {
  %loop.2 = (s32[], f32[4,8,16]{2,1,0}) parameter(0)
  %i.2 = s32[] get-tuple-element(%loop.2), index=0
  %n.2 = s32[] constant(4)
  ROOT %lt.2 = pred[] compare(%i.2, %n.2), direction=LT
}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(%x, %y)
}

ENTRY %main (p.0: bf16[2,5,8], p.1: bf16[8,16], p.2: bf16[2,5,3,4], p.3: f32[4,8,16]) -> f32[16] {
  %p.0 = bf16[2,5,8]{2,1,0} parameter(0), metadata={op_name="batch"}
  %p.1 = bf16[8,16]{1,0} parameter(1), metadata={op_name="params"}
  %p.2 = bf16[2,5,3,4]{3,2,1,0} parameter(2)
  %p.3 = f32[4,8,16]{2,1,0} parameter(3)
  %mm = bf16[2,5,16]{2,1,0:T(8,128)} fusion(%p.0, %p.1), kind=kOutput, calls=%fused_dot, metadata={op_name="jit(train_step)/jvp(...d,df->...f)/dot_general"}
  %scores = f32[2,3,5,5]{3,2,1,0} fusion(%p.2, %p.2), kind=kOutput, calls=%fused_scores, metadata={op_name="jit(train_step)/jvp(blhe,bshe->bhls)/dot_general"}
  %moved = f32[2,5,3,5]{3,2,1,0} fusion(%scores), kind=kLoop, calls=%fused_copy, metadata={op_name="jit(train_step)/transpose(jvp())/transpose"}
  %dq = bf16[2,5,3,4]{3,2,1,0} fusion(%scores, %p.2), kind=kOutput, calls=%fused_dq, metadata={op_name="jit(train_step)/transpose(jvp(blhe,bshe->bhls))/dot_general"}
  %offload = (bf16[2,5,16]{2,1,0:S(5)}, bf16[2,5,16]{2,1,0}, u32[]{:S(2)}) copy-start(%mm)
  %offloaded = bf16[2,5,16]{2,1,0:S(5)} copy-done(%offload)
  %ss = ((f32[4,8,16]{2,1,0}), f32[1,8,16]{2,1,0:S(1)}, s32[]{:S(2)}) slice-start(%p.3), slice={[0:1], [0:8], [0:16]}
  %sd = f32[1,8,16]{2,1,0:S(1)} slice-done(%ss)
  %keep = pred[2,5,16]{2,1,0} compare(%mm, %mm), direction=GE, metadata={op_name="jit(train_step)/jvp()/ge"}
  %on_chip = bf16[2,5,16]{2,1,0:T(8,128)S(1)} add(%mm, %mm), metadata={op_name="jit(train_step)/jvp()/add"}
  %i.0 = s32[] constant(0)
  %init = (s32[], f32[4,8,16]{2,1,0}) tuple(%i.0, %p.3)
  %loop = (s32[], f32[4,8,16]{2,1,0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"4"}}
  %flat = f32[16]{0} reshape(%on_chip), metadata={op_name="jit(train_step)/sqrt"}
  ROOT %all-reduce.9 = f32[16]{0} all-reduce(%flat), channel_id=1, replica_groups={{0,1}}, to_apply=%add, metadata={op_name="jit(train_step)/reduce_sum"}
}
"""


def _row(result: breakdown.Breakdown, name: str) -> breakdown.Row:
  return next(r for r in result.rows if r.name == name)


def test_a_handwritten_module_is_counted_by_hand():
  b = breakdown.breakdown(HLO)
  assert {r.name: r.group for r in b.rows} == {
      "mm": "matmuls", "scores": "attention scores",
      "moved": "attention scores",  # the scores' elements, transposed
      "keep": "dropout / RNG", "on_chip": "other", "layer.1": "other",
      "flat": "optimizer", "all-reduce.9": "collectives",
      "dq": "matmuls",  # the einsum's transpose: not a score
      "offload": "memory-space copies", "offloaded": "memory-space copies",
      "lt.2": "other",  # the loop's condition: no source op
      "ss": "other", "sd": "other"}
  mm = _row(b, "mm")
  assert mm.written == 2 * 5 * 16 * 2  # bf16 output
  assert mm.read == 2 * 5 * 8 * 2 + 8 * 16 * 2
  assert mm.flops == 2 * (2 * 5 * 16) * 8
  scores = _row(b, "scores")
  assert scores.read == 2 * 5 * 3 * 4 * 2  # one operand, read once
  # 2 x 3 x 5 x 5 outputs of 4 multiply-adds (batch and heads as
  # dilated spatial dims, as XLA:TPU writes a batched dot)
  assert scores.flops == 2 * (2 * 3 * 5 * 5) * 4
  dq = _row(b, "dq")
  assert dq.scores == 2 * 3 * 5 * 5 * 4  # it reads the scores
  assert dq.flops == 2 * (2 * 5 * 3 * 4) * 5
  assert _row(b, "offload").read == 2 * 5 * 16 * 2
  offloaded = _row(b, "offloaded")
  assert offloaded.written == 0 and offloaded.host == 2 * 5 * 16 * 2
  assert _row(b, "keep").written == 2 * 5 * 16  # pred: one byte
  on_chip = _row(b, "on_chip")
  assert on_chip.written == 0 and on_chip.on_chip_written == 2 * 5 * 16 * 2
  assert _row(b, "flat").read == 0  # its operand is on chip
  layer = _row(b, "layer.1")
  assert layer.trips == 4
  # one layer's slice and the counter, 4 times
  assert layer.read == 4 * (8 * 16 * 4 + 4)
  assert layer.written == 4 * 8 * 16 * 4
  assert b.unknown_trip_loops == 0
  groups = {g["group"]: g for g in b.groups()}
  assert groups["attention scores"]["written"] == 2 * (2 * 3 * 5 * 5 * 4)
  assert groups["attention scores"]["instructions"] == 2
  # written by `scores`, read by `moved` and `dq`, written by `moved`
  assert sum(r.scores for r in b.rows) == 4 * (2 * 3 * 5 * 5 * 4)
  assert groups["other"]["instructions"] == 1 + 4 + 4 + 2
  # an asynchronous slice into on-chip memory reads its slice of the HBM
  # operand, not the whole operand
  assert _row(b, "ss").read == 8 * 16 * 4 and _row(b, "ss").written == 0
  assert _row(b, "sd").on_chip_written == 8 * 16 * 4


def test_the_json_field_and_table():
  j = breakdown.breakdown(HLO).as_json(top=4)
  assert [g["group"] for g in j["groups"]] == list(breakdown.GROUPS)
  assert sum(g["share_of_written"] for g in j["groups"]) == pytest.approx(1)
  assert [t["name"] for t in j["top"]] == ["layer.1", "moved", "dq", "scores"]
  assert j["top"][3]["op_name"] == "jvp(blhe,bshe->bhls)/dot_general"
  assert j["top"][0]["count"] == 4  # the loop body's fusion, 4 trips
  assert j["host_gb"] == 2 * 5 * 16 * 2 / 1e9
  assert j["layout_copies_any_group"]["instructions"] == 1  # `moved`
  text = breakdown.table(j)
  assert "attention scores" in text and "jvp(blhe,bshe->bhls)" in text
  json.dumps(j)


def test_trip_counts_from_the_loop_condition():
  """Without XLA's known_trip_count (libtpu's optimized HLO has none), a
  condition ``counter < constant`` gives the trips; another is unknown,
  counted once and said."""
  hlo = HLO.replace(', backend_config={"known_trip_count":{"n":"4"}}', "")
  b = breakdown.breakdown(hlo)
  assert _row(b, "layer.1").trips == 4 and b.unknown_trip_loops == 0
  b = breakdown.breakdown(hlo.replace("%i.0 = s32[] constant(0)",
                                      "%i.0 = s32[] constant(1)"))
  assert _row(b, "layer.1").trips == 3
  b = breakdown.breakdown(hlo.replace("direction=LT", "direction=NE"))
  assert _row(b, "layer.1").trips == 1 and b.unknown_trip_loops == 1
  # a decoding loop: `counter < 4 and not done` runs at most 4 times
  b = breakdown.breakdown(hlo.replace(
      "  ROOT %lt.2 = pred[] compare(%i.2, %n.2), direction=LT",
      "  %lt.2 = pred[] compare(%i.2, %n.2), direction=LT\n"
      "  %go.2 = pred[] constant(true)\n"
      "  ROOT %and.2 = pred[] and(%lt.2, %go.2)"))
  assert _row(b, "layer.1").trips == 4 and b.unknown_trip_loops == 0
  assert b.loops_at_their_bound == 1
  assert "counted at their bound" in breakdown.table(b.as_json())
  with pytest.raises(ValueError, match="no ENTRY"):
    breakdown.breakdown(HLO.replace("ENTRY ", ""))


def test_breakdown_is_for_one_compile_not_a_search(capsys):
  assert cli.main(["bench", "compile", "--topology", "v5e:2x2",
                   "--gin_file=gin/fid/tiny.gin", "--search",
                   "--breakdown"]) == 2
  assert capsys.readouterr().err.strip() == (
      "jaxfid bench: error: --breakdown: breaks down one compile, not a "
      "--search; rerun the search's best flags with --breakdown")


def test_the_compile_process_is_asked_for_the_breakdown(monkeypatch):
  args = cli.build_parser().parse_args(
      ["bench", "compile", "--topology", "v5e-4", "--gin_file=x.gin",
       "--breakdown"])
  args.gin_bindings = []
  seen = []

  def run(argv, **_):
    seen.append(argv)
    return subprocess.CompletedProcess(argv, 0, '{"fits": true}\n', "")
  monkeypatch.setattr(subprocess, "run", run)
  assert command.compile_in_child(args, {}, None) == {"fits": True}
  assert "--breakdown" in seen[0]


# ---- compiled for v5e:2x2 ----------------------------------------------------

TINY = ["--gin_file=gin/fid/tiny.gin", "--gin.config.T5Config.vocab_size=128",
        "--gin.config.T5Config.num_layers=2",
        "--gin.config.T5Config.num_decoder_layers=1", "--gin.BATCH_SIZE=8",
        "--gin.N_CONTEXT=2", "--gin.TEXT_MAXLENGTH=16",
        "--gin.ANSWER_MAXLENGTH=4"]


@pytest.fixture(autouse=True)
def _clear_gin():
  yield
  gin.clear_config()


def _compile(capsys, *argv) -> tuple[dict, str]:
  if not topologies.libtpu_available():
    pytest.skip("libtpu is not installed (pip install -e '.[tpu]')")
  assert cli.main(["bench", "compile", "--in-process", "--topology",
                   "v5e:2x2", *TINY, "--breakdown", *argv]) == 0
  captured = capsys.readouterr()
  return json.loads(captured.out.strip().splitlines()[-1]), captured.err


@pytest.mark.tpu
@pytest.mark.parametrize("scan", [False, True])
def test_a_tiny_step_breaks_down(capsys, scan):
  """The matmul FLOPs of the compiled HLO, scanned layers times their
  trips, are the program's own count; the scores of 2 encoder layers and a
  decoder layer's two attentions (forward and backward) are found. The
  einsum attention: the TPU kernel's matmuls are inside a custom call,
  which the breakdown counts bytes of, not FLOPs."""
  r, err = _compile(capsys, f"--gin.SCAN_LAYERS={scan}",
                    "--gin.ATTENTION='reference'")
  b = r["breakdown"]
  assert b["flops"] == pytest.approx(r["program_flops_per_chip"], rel=1e-6)
  assert b["unknown_trip_loops"] == 0
  groups = {g["group"]: g for g in b["groups"]}
  assert groups["attention scores"]["instructions"] >= 3 * 2
  assert groups["matmuls"]["flops"] > 0
  assert len(b["top"]) == 15
  assert "where the bytes go" in err and "attention scores" in err
