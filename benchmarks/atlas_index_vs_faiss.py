"""Atlas's sharded passage index against FAISS ``IndexFlatIP``, same vectors.

One run, side by side: ``--vectors`` random clustered vectors of ``--dim``
(``--clusters`` Gaussian centres, as ``dense_search.py`` draws them) and
``--queries`` query vectors, searched for their ``--top-k`` by inner product

* **faiss**: ``IndexFlatIP`` holding the float32 vectors,
  ``index.search(queries, k)`` on the whole query matrix, on each
  ``--faiss-threads`` count of CPU threads;
* **jaxfid**: :class:`jaxfid.atlas.index.PassageIndex` (what Atlas's
  training and ``jaxfid retrieve --device`` search) with each
  ``--dtypes`` storage (bfloat16, int8 with per-row scales, float32), its
  rows sharded over a 1-D mesh of each ``--devices`` count, queries in
  calls of ``--query-batch`` (as the in-loop search makes them), the hits
  brought back to the host.

Each system runs in a process of its own (the device count is
``--xla_force_host_platform_device_count`` on a CPU host, set before JAX
starts; on an accelerator host, ``--platform gpu`` takes the first N real
devices). Index building and compilation are excluded (a warm-up search
first); the best of ``--passes`` passes over all queries is kept. Printed:
the hardware and load, queries/s, the index's bytes on each device (FAISS:
its one copy), and the share of FAISS's top k each jaxfid run returns
(float32 and bfloat16: ties and rounding; int8: its quantisation).

On a CPU host the simulated devices share the same cores: 8 devices there
measure the sharding's overhead (per-device top k, all-gather, merge), not
a speed-up.

Usage:
  python benchmarks/atlas_index_vs_faiss.py [--vectors 100000] [--dim 768]
      [--queries 512] [--top-k 100] [--devices 1,8] [--dtypes bfloat16,int8]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from cpu_host import load_average, summary  # noqa: E402
from dense_search import best_of_passes, clustered  # noqa: E402


def make_data(args, workdir: str) -> None:
  """``vectors.npy`` [N, D] and ``queries.npy`` [Q, D], float32."""
  draw = clustered(np.random.default_rng(0), args.clusters, args.dim)
  np.save(os.path.join(workdir, "vectors.npy"), draw(args.vectors))
  np.save(os.path.join(workdir, "queries.npy"), draw(args.queries))


def faiss_worker(workdir: str, opts: dict) -> dict:
  import faiss
  faiss.omp_set_num_threads(opts["threads"])
  vectors = np.load(os.path.join(workdir, "vectors.npy"))
  queries = np.load(os.path.join(workdir, "queries.npy"))
  index = faiss.IndexFlatIP(vectors.shape[1])
  index.add(vectors)
  index.search(queries[:8], opts["top_k"])                     # warm-up
  seconds, _, (_, ids) = best_of_passes(
      lambda: index.search(queries, opts["top_k"]), opts["passes"])
  if opts["reference"]:  # the top k every jaxfid run is compared with
    np.save(os.path.join(workdir, "faiss_ids.npy"), ids)
  return {"system": "faiss", "devices": 1, "dtype": "float32",
          "seconds": seconds, "bytes_per_device": index.ntotal * index.d * 4,
          "threads": faiss.omp_get_max_threads(),
          "faiss": faiss.__version__}


def jaxfid_worker(workdir: str, opts: dict) -> dict:
  import jax
  import jax.numpy as jnp
  from jax.sharding import Mesh
  from jaxfid.atlas.index import PassageIndex
  vectors = np.load(os.path.join(workdir, "vectors.npy"))
  queries = np.load(os.path.join(workdir, "queries.npy"))
  devices = jax.devices()[:opts["devices"]]
  if len(devices) != opts["devices"]:
    raise SystemExit(f"{len(devices)} devices, not {opts['devices']}")
  mesh = Mesh(np.array(devices), ("rows",))
  index = PassageIndex(mesh, len(vectors), vectors.shape[1], opts["dtype"],
                       batch_size=1)
  index.set_rows(vectors)
  stored = [index.embeddings] + ([index.scales] if index.quantized else [])
  on_device = max(sum(s.data.nbytes for a in stored
                      for s in a.addressable_shards if s.device == d)
                  for d in devices)
  assert on_device == index.device_bytes(), (on_device, index.device_bytes())
  qb, k = opts["query_batch"], opts["top_k"]
  batches = [jnp.asarray(queries[i:i + qb])
             for i in range(0, len(queries), qb)]

  def run():
    return np.concatenate([np.asarray(index.search(q, k)[1])
                           for q in batches])

  run()                                                        # compiles
  seconds, _, ids = best_of_passes(run, opts["passes"])
  want = np.load(os.path.join(workdir, "faiss_ids.npy"))
  same = np.mean([len(set(a) & set(b)) / k for a, b in zip(ids, want)])
  return {"system": "jaxfid", "devices": len(devices),
          "dtype": opts["dtype"], "seconds": seconds,
          "bytes_per_device": on_device, "same_as_faiss": float(same),
          "platform": devices[0].platform, "jax": jax.__version__}


def run_worker(kind: str, workdir: str, opts: dict, env: dict) -> dict:
  cmd = [sys.executable, os.path.abspath(__file__), "--worker", kind,
         workdir, json.dumps(opts)]
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False,
                        env=env)
  if proc.returncode != 0:
    raise RuntimeError(f"{kind} {opts} failed:\n{proc.stderr[-3000:]}")
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  result["load_after"] = load_average()
  print(f"  {json.dumps(result)}", flush=True)
  return result


def _env(devices: int, platform_name: str) -> dict:
  env = dict(os.environ, PYTHONPATH=ROOT)
  if platform_name == "cpu":
    flags = env.get("XLA_FLAGS", "")
    env["XLA_FLAGS"] = (f"{flags} --xla_force_host_platform_device_count="
                        f"{devices}").strip()
    env["JAX_PLATFORMS"] = "cpu"
  else:
    env["JAX_PLATFORMS"] = platform_name
  return env


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--vectors", type=int, default=100_000)
  parser.add_argument("--dim", type=int, default=768)
  parser.add_argument("--queries", type=int, default=512)
  parser.add_argument("--clusters", type=int, default=1000)
  parser.add_argument("--top-k", type=int, default=100)
  parser.add_argument("--query-batch", type=int, default=256,
                      help="queries per jaxfid search call")
  parser.add_argument("--devices", default="1,8",
                      help="device counts, comma-separated")
  parser.add_argument("--dtypes", default="bfloat16,int8",
                      help="jaxfid storages, comma-separated")
  parser.add_argument("--platform", default="cpu",
                      help="cpu (simulated devices) or the accelerator's "
                      "JAX platform (its first N devices)")
  parser.add_argument("--faiss-threads", default=f"1,{os.cpu_count()}",
                      help="FAISS's CPU threads, comma-separated settings")
  parser.add_argument("--passes", type=int, default=3)
  parser.add_argument("--workdir", default=None)
  parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.worker:
    kind, workdir, opts = args.worker
    work = faiss_worker if kind == "faiss" else jaxfid_worker
    print(json.dumps(work(workdir, json.loads(opts))))
    return 0
  print(f"machine: {summary()}; {platform.platform()}, python "
        f"{platform.python_version()}, numpy {np.__version__}", flush=True)
  counts = [int(d) for d in args.devices.split(",")]
  base = {"top_k": args.top_k, "passes": args.passes,
          "query_batch": args.query_batch}
  rows = []
  with tempfile.TemporaryDirectory(dir=args.workdir) as workdir:
    make_data(args, workdir)
    for i, threads in enumerate(args.faiss_threads.split(",")):
      rows.append(run_worker("faiss", workdir, {
          **base, "threads": int(threads), "reference": i == 0},
          dict(os.environ)))
    for dtype in args.dtypes.split(","):
      for count in counts:
        rows.append(run_worker("jaxfid", workdir, {
            **base, "devices": count, "dtype": dtype},
            _env(count, args.platform)))
  print(f"\n{args.vectors:,} vectors x {args.dim}, {args.queries:,} queries "
        f"(jaxfid: {args.query_batch} a call), top {args.top_k}, best of "
        f"{args.passes} passes; load at end {load_average()}\n")
  print("| system | devices | storage | bytes per device | queries/s | "
        "share of FAISS's top k |")
  print("|---|---|---|---|---|---|")
  for r in rows:
    device = (f"{r['devices']} {r['platform']}" if r["system"] == "jaxfid"
              else f"{r['threads']} CPU threads")
    same = f"{r['same_as_faiss']:.4f}" if "same_as_faiss" in r else "-"
    mb = r["bytes_per_device"] / 1e6
    print(f"| {r['system']} | {device} | {r['dtype']} | "
          f"{mb:.{1 if mb > 10 else 3}f} MB | "
          f"{args.queries / r['seconds']:.0f} | {same} |")
  print(json.dumps(rows))
  return 0


if __name__ == "__main__":
  sys.exit(main())
