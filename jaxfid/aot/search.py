"""``jaxfid bench compile --search``: which settings fit a slice, and fastest.

The alternatives a user sizing a pod job would try, compiled for real and
ranked by the roofline step time of the compiled program (the compiler's
FLOPs count remat's recomputation, so a lighter remat ranks ahead when it
fits):

* mesh splits of the chips (``MESH``): all data parallel, all FSDP, and
  FSDP with tensor parallelism over 2 and 4 chips (``model=2``,
  ``model=4``); a split whose data-parallel size does not divide the batch
  is skipped without compiling;
* remat (``REMAT``) per split: the lightest that fits (a heavier one would
  only be slower). The first split walks up from ``none`` (``none``,
  ``dots``, ``full``); a later one starts at the lightest remat that fitted
  on a split already done and walks down while they fit, or up until one
  fits (memory falls from ``none`` to ``full``, so the answer is the same
  and, at paper sizes where only ``full`` fits, each later split costs two
  compiles instead of three);
* accumulation (``ACCUMULATION_STEPS``: 2, 4, 8, ... microbatches of the
  same global batch) only when nothing fits at the run's own, stopping at
  the first number of microbatches where something fits; there remat is
  tried from ``full`` down to the lightest that still fits;
* scanned layers (``SCAN_LAYERS``) flipped once, on the best, for its
  memory and compile time: it is the same computation, so its row is shown
  but not ranked (the compiler's cost analysis counts a scanned body once,
  so the two rooflines differ by how each counts, not by the work).

Each configuration compiles in a process of its own (``compile_fn``): a
compiler that crashes on one costs that row, not the search, and each
compile's host memory is returned when it ends. ``--jobs N`` searches N
splits at once (N compiles side by side, each with one compile's host
memory), rows printed as they finish.

The table goes to stderr as the compiles finish, then what fits ranked
fastest first, then the best as the ``--gin.`` flags to add;
the returned record is the best's fields with ``flags``, ``search`` (one
line per compile) and ``compiles``.
"""
from __future__ import annotations

import concurrent.futures
import sys
import threading
from typing import Callable

from jaxfid.core.errors import InputError

REMATS = ("none", "dots", "full")


class CompileFailed(Exception):
  """One configuration's compile failed (its process exited with an error
  or was killed); ``message`` is one line, ``exit_code`` the command's (2:
  the configuration, 1: a crash)."""

  def __init__(self, message: str, exit_code: int = 1):
    super().__init__(message)
    self.message = message
    self.exit_code = exit_code

MAX_ACCUMULATION = 64


def splits(chips: int) -> list[str]:
  """``MESH`` values to try on ``chips`` chips (module docstring)."""
  out = [f"data={chips}"]
  for model in (1, 2, 4):
    if chips % model == 0 and chips // model >= 2:
      rest = chips // model
      out.append(f"fsdp={rest}" + (f",model={model}" if model > 1 else ""))
  return list(dict.fromkeys(out))


def _data_parallel(mesh: str) -> int:
  sizes = dict((k, int(v)) for k, v in (p.split("=") for p in mesh.split(",")))
  return sizes.get("data", 1) * sizes.get("fsdp", 1)


def _flag(name: str, value) -> str:
  """A ``--gin.`` flag as a shell takes it (a string keeps its quotes)."""
  return (f"--gin.{name}=\"{value!r}\"" if isinstance(value, str)
          else f"--gin.{name}={value!r}")


def _row(macros: dict, result: dict | None, error: str | None) -> dict:
  row = dict(macros)
  if error is not None:
    row["error"] = error
    return row
  row["fits"] = result["fits"]
  for key in ("per_chip_gb", "required_gb", "roofline_step_s",
              "examples_per_sec_at_roofline"):
    if result.get(key) is not None:
      row[key] = result[key]
  return row


def _table(rows: list[dict]) -> str:
  lines = [f"{'REMAT':<6} {'MESH':<22} {'ACCUM':>5} {'SCAN':<5} "
           f"{'GB/chip':>8} {'fits':<5} {'ms/step':>9} {'examples/s':>11}"]
  for r in rows:
    if "error" in r:
      tail = f"error: {r['error']}"
    else:
      gb = r.get("per_chip_gb") or r.get("required_gb")
      ms = r.get("roofline_step_s")
      eps = r.get("examples_per_sec_at_roofline")
      tail = (f"{'' if gb is None else f'{gb:.2f}':>8} {str(r['fits']):<5} "
              f"{'' if ms is None else f'{ms * 1e3:.2f}':>9} "
              f"{'' if eps is None else f'{eps:.1f}':>11}")
    if r.get("ranked") is False:
      tail += "  (SCAN_LAYERS flipped: the same computation, not ranked)"
    lines.append(f"{r['REMAT']:<6} {r['MESH']:<22} "
                 f"{r['ACCUMULATION_STEPS']:>5} {str(r['SCAN_LAYERS']):<5} "
                 + tail)
  return "\n".join(lines)


def _say_row(row: dict) -> None:
  """A row on stderr in one write (a SIGTERM's line never lands inside it:
  ``jaxfid.aot.command``)."""
  sys.stderr.write(_table([row]).splitlines()[1] + "\n")


def _rank(fit: tuple[float, dict, dict]) -> tuple[float, float]:
  """Fastest first; at equal speed, the smaller per chip."""
  return fit[0], fit[2]["per_chip_gb"]


def search(compile_fn: Callable[..., dict], flops_fn: Callable[[], object],
           built, target, program: str, jobs: int = 1) -> dict:
  """Compiles the alternatives (module docstring) with
  ``compile_fn(macros, model_flops)``; ``built`` is the run as given
  (its batch, accumulation and scan setting start the search). ``jobs``
  splits are searched at once (each split's remats in order), so up to
  ``jobs`` compiles run together."""
  chips = len(target.devices)
  batch = built.settings.batch_size
  base = {"REMAT": built.remat, "MESH": built.settings.mesh or f"data={chips}",
          "ACCUMULATION_STEPS": built.settings.accumulation_steps,
          "SCAN_LAYERS": built.scan_layers}
  flops = flops_fn()
  rows: list[dict] = []
  fitting: list[tuple[float, dict, dict]] = []
  smallest: list[tuple[float, dict]] = []
  lock = threading.Lock()  # the lists and stderr, shared by the jobs

  def attempt(macros: dict, ranked: bool = True) -> dict | None:
    try:
      result = compile_fn(macros, flops)
    except (InputError, CompileFailed) as e:
      with lock:
        rows.append(_row(macros, None, e.message))
        _say_row(rows[-1])
      return None
    with lock:
      rows.append(_row(macros, result, None))
      if not ranked:
        rows[-1]["ranked"] = False
      _say_row(rows[-1])
      if not ranked:
        return result
      if result["fits"]:
        fitting.append((result["roofline_step_s"], macros, result))
      else:
        need = result.get("per_chip_gb") or result.get("required_gb")
        smallest.append((float("inf") if need is None else need, result))
    return result

  def each_split(chain: Callable[[str], None]) -> None:
    """``chain(mesh)`` for every split, ``jobs`` at a time."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
      for future in [pool.submit(chain, mesh) for mesh in splits(chips)]:
        future.result()

  def sweep(accumulation: int, lightest_first: bool) -> None:
    """Per split, the lightest remat that fits (module docstring): the
    walk starts at ``none`` (or, with more microbatches, where the light
    ones rarely fit, at ``full``) until a split has found one, then at the
    lightest found so far."""
    found: list[int] = []  # REMATS indices that fitted, splits done

    def fits_at(mesh: str, i: int) -> bool:
      result = attempt({**base, "MESH": mesh, "REMAT": REMATS[i],
                        "ACCUMULATION_STEPS": accumulation})
      return result is not None and result["fits"]

    def chain(mesh: str) -> None:
      if batch % (_data_parallel(mesh) * accumulation):
        return  # the batch does not split: nothing to compile
      with lock:
        i = min(found) if found else (0 if lightest_first else
                                      len(REMATS) - 1)
      if fits_at(mesh, i):  # down to the lightest that still fits
        while i > 0 and fits_at(mesh, i - 1):
          i -= 1
      else:  # up to the first that fits
        while i < len(REMATS) - 1:
          i += 1
          if fits_at(mesh, i):
            break
        else:
          return
      with lock:
        found.append(i)
    each_split(chain)

  print(_table([]), file=sys.stderr)
  if program == "train":
    sweep(base["ACCUMULATION_STEPS"], lightest_first=True)
    accumulation = base["ACCUMULATION_STEPS"] * 2
    while not fitting and accumulation <= min(batch, MAX_ACCUMULATION):
      sweep(accumulation, lightest_first=False)
      accumulation *= 2
  else:  # decoding: the splits alone (its batch is rounded up over them)
    each_split(lambda mesh: attempt({**base, "MESH": mesh}))
  if fitting:
    _, macros, _ = min(fitting, key=_rank)
    attempt({**macros, "SCAN_LAYERS": not macros["SCAN_LAYERS"]},
            ranked=False)
  compiles = sum("error" not in r for r in rows)
  if not fitting:
    need, best = min(smallest, key=lambda s: s[0]) if smallest else (None,
                                                                     None)
    print(f"nothing fits on {target.topology.name} ({compiles} compiles); "
          + (f"the smallest needs {need:.2f} GB per chip of "
             f"{target.chip.hbm_bytes / 1e9:.2f}" if best else
             "no configuration compiled"), file=sys.stderr)
    out = dict(best or {})
    out.update(fits=False, flags=[], search=rows, compiles=compiles)
    return out
  ranked = sorted((f for f in fitting), key=_rank)
  print("what fits, fastest first:\n" + _table(
      [_row(m, r, None) for _, m, r in ranked]), file=sys.stderr)
  _, macros, best = ranked[0]
  flags = [_flag(k, v) for k, v in macros.items() if v != base[k]]
  print(f"best of {compiles} compiles: {best['per_chip_gb']:.2f} GB per "
        f"chip, roofline {best['roofline_step_s'] * 1e3:.2f} ms/step; add: "
        + (" ".join(flags) or "(the run's own settings)"), file=sys.stderr)
  return {**best, "flags": flags, "search": rows, "compiles": compiles}
