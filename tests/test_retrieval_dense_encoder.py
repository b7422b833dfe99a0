"""The dual encoder against transformers: mean pooling, GTR, encoder-only.

References are computed with PyTorch ``transformers.T5EncoderModel`` exactly
as sentence-transformers does it: ``last_hidden_state`` averaged over the
attention mask, then ``2_Dense`` (``nn.Linear``) and L2 normalisation.
"""
import json

import numpy as np
import pytest
from safetensors.numpy import save_file

# torch, transformers: None without PyTorch (the reference tests skip).
from hf_reference import (make_tiny_hf_checkpoint, require_torch, torch,
                          transformers)
from jaxfid.core.errors import InputError
from jaxfid.dual_encoder.checkpoint import load_dual_encoder
from jaxfid.dual_encoder.model import (
    DualEncoder, DualEncoderConfig, Embedder, passage_text)
from jaxfid.t5.config import preset


def _tokens():
  rng = np.random.default_rng(0)
  tokens = rng.integers(3, 160, size=(5, 11)).astype(np.int32)
  lengths = [11, 7, 3, 1, 9]
  for row, n in enumerate(lengths):
    tokens[row, n - 1] = 1  # EOS
    tokens[row, n:] = 0
  return tokens


def _torch_mean(model, tokens):
  ids = torch.tensor(tokens, dtype=torch.long)
  mask = (ids != 0).long()
  with torch.no_grad():
    hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
  m = mask.unsqueeze(-1).float()
  return ((hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)).numpy()


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  return make_tiny_hf_checkpoint(tmp_path_factory.mktemp("hf") / "t5",
                                 version="1.1")


def _embed(loaded, tokens):
  return np.asarray(loaded.encoder.embed(loaded.params, tokens))


def test_mean_pooling_matches_transformers(hf_dir):
  require_torch()
  loaded = load_dual_encoder(hf_dir)
  assert loaded.kind == "hf" and loaded.encoder.dim == 32
  assert loaded.encoder.settings == DualEncoderConfig()
  reference = transformers.T5EncoderModel.from_pretrained(hf_dir).eval()
  tokens = _tokens()
  np.testing.assert_allclose(_embed(loaded, tokens),
                             _torch_mean(reference, tokens), atol=2e-5)


def _sentence_transformers_dir(tmp_path, hf_dir, *, subfolder: bool):
  """A GTR-like directory: encoder-only weights, pooling, dense, normalize."""
  require_torch()
  root = tmp_path / "gtr"
  encoder = transformers.T5EncoderModel.from_pretrained(hf_dir).eval()
  weights = root / "0_Transformer" if subfolder else root
  encoder.save_pretrained(weights, safe_serialization=True)
  (root / "1_Pooling").mkdir(parents=True)
  (root / "1_Pooling" / "config.json").write_text(json.dumps(
      {"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True}))
  (root / "2_Dense").mkdir()
  weight = np.random.default_rng(1).standard_normal((24, 32)).astype(
      np.float32)
  if subfolder:  # older sentence-transformers releases: torch .bin
    torch.save({"linear.weight": torch.from_numpy(weight)},
               root / "2_Dense" / "pytorch_model.bin")
  else:
    save_file({"linear.weight": weight},
              str(root / "2_Dense" / "model.safetensors"))
  (root / "2_Dense" / "config.json").write_text(json.dumps(
      {"in_features": 32, "out_features": 24, "bias": False,
       "activation_function": "torch.nn.modules.linear.Identity"}))
  (root / "3_Normalize").mkdir()
  modules = [
      {"idx": 0, "name": "0", "path": "0_Transformer" if subfolder else "",
       "type": "sentence_transformers.models.Transformer"},
      {"idx": 1, "name": "1", "path": "1_Pooling",
       "type": "sentence_transformers.models.Pooling"},
      {"idx": 2, "name": "2", "path": "2_Dense",
       "type": "sentence_transformers.models.Dense"},
      {"idx": 3, "name": "3", "path": "3_Normalize",
       "type": "sentence_transformers.models.Normalize"}]
  (root / "modules.json").write_text(json.dumps(modules))
  return root, encoder, weight


@pytest.mark.parametrize("subfolder", [False, True])
def test_sentence_transformers_layout(tmp_path, hf_dir, subfolder):
  root, reference, weight = _sentence_transformers_dir(tmp_path, hf_dir,
                                                       subfolder=subfolder)
  loaded = load_dual_encoder(root)
  s = loaded.encoder.settings
  assert loaded.kind == "sentence-transformers"
  assert (s.pooling, s.normalize, s.projection_dim) == ("mean", True, 24)
  tokens = _tokens()
  want = _torch_mean(reference, tokens) @ weight.T
  want /= np.linalg.norm(want, axis=1, keepdims=True)
  got = _embed(loaded, tokens)
  np.testing.assert_allclose(got, want, atol=2e-5)
  np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
  unnormalised = load_dual_encoder(root, normalize=False)
  assert not unnormalised.encoder.settings.normalize


def test_encoder_only_checkpoint_with_bad_tensor(tmp_path, hf_dir):
  require_torch()
  encoder = transformers.T5EncoderModel.from_pretrained(hf_dir)
  encoder.save_pretrained(tmp_path / "enc", safe_serialization=True)
  loaded = load_dual_encoder(tmp_path / "enc")
  np.testing.assert_allclose(_embed(loaded, _tokens()),
                             _torch_mean(encoder.eval(), _tokens()), atol=2e-5)
  config = json.loads((tmp_path / "enc" / "config.json").read_text())
  config["d_ff"] = 48
  (tmp_path / "enc" / "config.json").write_text(json.dumps(config))
  with pytest.raises(InputError, match="has shape .* expected"):
    load_dual_encoder(tmp_path / "enc")
  with pytest.raises(InputError, match="no such checkpoint"):
    load_dual_encoder(tmp_path / "missing")


def test_embedder_pads_batches_and_lengths(hf_dir):
  loaded = load_dual_encoder(hf_dir, passage_maxlength=16)
  embedder = Embedder(loaded.encoder, loaded.params, loaded.tokenizer,
                      batch_size=3, length_bucket=4)
  assert embedder.batch_size == 8  # rounded up to the 8 test devices
  texts = [f"passage number {i} " + "word " * i for i in range(11)]
  together = embedder.embed(texts)
  assert together.shape == (11, 32)
  alone = np.concatenate([embedder.embed([t]) for t in texts[:3]])
  np.testing.assert_allclose(together[:3], alone, atol=1e-5)
  tokens = embedder.tokenize(["a b c", "one two three four five six"], 16)
  assert tokens.shape[1] % 4 == 0 and tokens.shape[1] <= 16
  assert embedder.embed([]).shape == (0, 32)


def test_passage_formats_and_separate_towers():
  assert passage_text("T", "body") == "T body"
  assert passage_text("", "body") == "body"
  assert passage_text("T", "body", "fid") == "title: T context: body"
  config = preset("tiny").replace(vocab_size=64, num_layers=1)
  encoder = DualEncoder(config, DualEncoderConfig(shared=False,
                                                  projection_dim=8))
  params = encoder.init_params(0)
  assert set(params) == {"token_embedder", "encoder", "decoder",
                         "projection", "query_tower"}
  tokens = np.array([[5, 6, 1, 0]], np.int32)
  q = encoder.embed(params, tokens, tower="query")
  p = encoder.embed(params, tokens, tower="passage")
  assert q.shape == p.shape == (1, 8)
  assert not np.allclose(q, p)
  shapes = encoder.abstract_params()
  assert shapes["query_tower"]["projection"]["kernel"].shape == (64, 8)
  with pytest.raises(InputError, match="POOLING: must be one of 'mean', "
                     "'first', got 'max'"):
    DualEncoderConfig(pooling="max")


def test_t5x_checkpoint_gives_the_same_vectors(tmp_path, hf_dir):
  from jaxfid.checkpoints import read_hf, write_t5x
  fields, flat = read_hf(hf_dir)
  ckpt = write_t5x(tmp_path / "t5x", fields, flat, step=3)
  loaded = load_dual_encoder(ckpt)
  assert loaded.kind == "t5x"
  np.testing.assert_allclose(_embed(loaded, _tokens()),
                             _embed(load_dual_encoder(hf_dir), _tokens()),
                             atol=1e-6)
