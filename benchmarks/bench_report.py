"""Output of ``fid_vs_pytorch.py``: log lines, the markdown table, the JSON."""
from __future__ import annotations

import json
import os
import tempfile


def brief(row: dict) -> str:
  """One row as a log line, so a run cut short still leaves its numbers."""
  memory = _memory(row)
  return (f"  -> {row['name']} b={row['batch_size']}: {row['step_time_s']:.4f} "
          f"s/step, {row['examples_per_sec']:.2f} examples/s, "
          f"{100 * row['mfu']:.1f}% MFU, peak memory {memory}"
          f"{'' if memory == 'n/a' else ' GB'}, setup {row['setup_s']:.1f} s")


def _fmt(x, spec, none="n/a"):
  return none if x is None else format(x, spec)


def _memory(r) -> str:
  if r["peak_memory_source"].startswith("growth"):
    return f"+{r['peak_memory_gb']:.2f}" if r["peak_memory_gb"] > 0 else "n/a"
  return ("" if r["peak_memory_exact"] else "<= ") + f"{r['peak_memory_gb']:.1f}"


def table(rows: list[dict]) -> str:
  head = ("| row | batch | step time (s) | CPU s/step | examples/s "
          "| model TFLOP/s | MFU | peak memory (GB) | setup+compile (s) "
          "| x torch | x torch.compile |")
  lines = [head, "|" + "---|" * 11]
  for r in rows:
    lines.append(
        f"| {r['name']} | {r['batch_size']} | {r['step_time_s']:.4f} "
        f"| {_fmt(r.get('cpu_time_s'), '.3f')} "
        f"| {r['examples_per_sec']:.2f} | {r['model_tflops_per_sec']:.3f} "
        f"| {100 * r['mfu']:.1f}% | {_memory(r)} | {r['setup_s']:.1f} "
        f"| {_fmt(r['vs_torch'], '.2f')} | {_fmt(r['vs_torch_compile'], '.2f')} |")
  return "\n".join(lines)


def write_json(path: str, result: dict) -> None:
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=".fid_vs_pytorch.")
  try:
    with os.fdopen(fd, "w") as f:
      json.dump(result, f, indent=1)
    os.replace(tmp, path)
  except BaseException:
    os.unlink(tmp)
    raise
