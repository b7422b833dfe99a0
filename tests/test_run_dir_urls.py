"""A MODEL_DIR on a bucket (``gs://bucket/run``) takes the same code as a local one.

etils.epath gets a fake ``gs`` backend that keeps the bucket in a local
directory: training, resuming and predicting with
``MODEL_DIR='gs://bucket/run'`` must put every file jaxfid writes there, and
nothing in a local ``gs:`` directory (what ``os.path`` makes of the URL).
Orbax writes its checkpoints to GCS through tensorstore's own GCS driver,
which no local fake reaches; the test checks that orbax is handed the URL
unchanged and lets it write the fake bucket's directory instead.
"""
from __future__ import annotations

import json
import os

import pytest
from etils.epath import backend as backend_lib
from etils.epath import gpath

from jaxfid.checkpoints import model_dir as model_dir_lib
from jaxfid.cli import main

WORDS = "red green blue paris london dog cat bread".split()


class LocalBucket(type(backend_lib.os_backend)):
  """``gs://NAME/...`` files kept under a local root directory."""

  def __init__(self, root: str):
    self.root = root

  def _local(self, path) -> str:
    path = os.fspath(path)
    return (os.path.join(self.root, path[len("gs://"):])
            if path.startswith("gs://") else path)

  def _url(self, path: str) -> str:
    rel = os.path.relpath(path, self.root)
    return path if rel.startswith("..") else "gs://" + rel

  def open(self, path, mode):
    return super().open(self._local(path), mode)

  def exists(self, path):
    return super().exists(self._local(path))

  def isdir(self, path):
    return super().isdir(self._local(path))

  def listdir(self, path):
    return super().listdir(self._local(path))

  def glob(self, path):
    return [self._url(p) for p in super().glob(self._local(path))]

  def walk(self, top, *, top_down=True, on_error=None):
    for d, dirs, files in super().walk(self._local(top), top_down=top_down,
                                       on_error=on_error):
      yield self._url(d), dirs, files

  def makedirs(self, path, *, exist_ok=False, mode=0o777):
    return super().makedirs(self._local(path), exist_ok=exist_ok, mode=mode)

  def mkdir(self, path, *, exist_ok=False, mode=0o777):
    return super().mkdir(self._local(path), exist_ok=exist_ok, mode=mode)

  def rmtree(self, path):
    return super().rmtree(self._local(path))

  def remove(self, path):
    return super().remove(self._local(path))

  def rename(self, path, dst):
    return super().rename(self._local(path), self._local(dst))

  def replace(self, path, dst):
    return super().replace(self._local(path), self._local(dst))

  def copy(self, path, dst, overwrite):
    return super().copy(self._local(path), self._local(dst), overwrite)

  def stat(self, path):
    return super().stat(self._local(path))


@pytest.fixture
def bucket(tmp_path, monkeypatch):
  root = tmp_path / "bucket_store"
  root.mkdir()
  fake = LocalBucket(str(root))
  # pylint: disable=protected-access
  monkeypatch.setitem(gpath._PREFIX_TO_BACKEND, "gs", fake)
  monkeypatch.setattr(gpath, "_GCS_BACKENDS", gpath._GCS_BACKENDS | {fake})
  # pylint: enable=protected-access
  monkeypatch.setattr(gpath, "_is_tf_installed", lambda: False)
  real_manager = model_dir_lib._manager
  seen = []

  def manager(directory, keep, **kwargs):  # orbax gets the URL as it is
    seen.append(directory)
    return real_manager(fake._local(directory), keep, **kwargs)

  monkeypatch.setattr(model_dir_lib, "_manager", manager)
  work = tmp_path / "cwd"
  work.mkdir()
  monkeypatch.chdir(work)
  return root, seen


def _data(directory):
  examples = [{"question": f"what is thing {i}?", "answers": [WORDS[i % 8]],
               "ctxs": [{"title": "t", "text": f"thing {i} is {WORDS[i % 8]}",
                         "score": 1.0}]} for i in range(8)]
  path = directory / "train.json"
  path.write_text(json.dumps(examples))
  return path


def _train(data, steps):
  return main(["train", "--gin_file=gin/fid/tiny.gin",
               "--gin.MODEL_DIR='gs://bucket/run'", f"--gin.TRAIN_DATA='{data}'",
               f"--gin.EVAL_DATA='{data}'", f"--gin.TRAIN_STEPS={steps}",
               "--gin.BATCH_SIZE=4", "--gin.N_CONTEXT=1",
               "--gin.TEXT_MAXLENGTH=12", "--gin.ANSWER_MAXLENGTH=3",
               "--gin.EVAL_EVERY=2", "--gin.CHECKPOINT_EVERY=2",
               "--gin.LOG_EVERY=1", "--gin.MESH='data=2'",
               "--gin.loop.train.progress=False"])


def test_a_bucket_model_dir_trains_resumes_and_predicts(bucket, tmp_path,
                                                        capsys):
  bucket, seen = bucket
  data = _data(tmp_path)
  assert _train(data, 2) == 0
  assert seen[:2] == ["gs://bucket/run/checkpoints", "gs://bucket/run/best"]
  assert _train(data, 4) == 0    # resumes from the bucket's step 2
  run = bucket / "bucket" / "run"
  assert {"jaxfid_config.json", "spiece.model", "metrics.jsonl",
          "checkpoints", "best", "eval", "tb"} <= set(os.listdir(run))
  assert sorted(os.listdir(run / "checkpoints")) == ["2", "4"]
  steps = [json.loads(line)["step"] for line in
           (run / "metrics.jsonl").read_text().splitlines()
           if '"loss"' in line]
  assert steps == [1, 2, 3, 4]
  assert "resumed from step 2" in capsys.readouterr().err
  assert any(name.startswith("events") for name in os.listdir(run / "tb"))
  assert not os.path.exists(tmp_path / "cwd" / "gs:")
  out = tmp_path / "pred.jsonl"
  assert main(["predict", "--checkpoint", "gs://bucket/run", "--data",
               str(data), "--n-context", "1", "--text-maxlength", "12",
               "--answer-maxlength", "3", "--output", str(out)]) == 0
  assert len(out.read_text().splitlines()) == 8
  assert not os.path.exists(tmp_path / "cwd" / "gs:")
