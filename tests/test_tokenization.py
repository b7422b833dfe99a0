"""jaxfid.core.tokenization against Hugging Face's T5 tokenizer and seqio."""
import gzip
import os
import pickle
import shutil

import numpy as np
import pytest

from jaxfid.core.errors import InputError
from jaxfid.core.tokenization import (
    DECODER_START_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer, bundled_vocab_path,
    encode_padded, load_tokenizer)
from tasks.vocabulary import seqio_vocabulary

DATA = os.path.join(os.path.dirname(__file__), "data")

SENTENCES = [
    "who wrote hamlet?",
    "Hello world!",
    "question: who wrote hamlet? title: Hamlet context: Hamlet is a tragedy "
    "written by William Shakespeare sometime between 1599 and 1601.",
    "Café naïve résumé — “quoted” ‘single’ «guillemets»",
    "Straße, Ærøskøbing, São Paulo, Zürich, Kraków",
    "1,234.56 $% & (x) [y] {z} a/b c\\d e|f #tag @user ~tilde^",
    "It's 5 o'clock; isn't it? Yes -- no... maybe!!",
    "  leading  and   multiple spaces ",
    "tabs\tand\nnewlines\r\nhere",
    "ﬁ ligature ½ ① full-width ＡＢＣ",  # NFKC-normalised by the model
    "日本語のテキスト and emoji 😀",  # pieces the vocabulary lacks -> UNK
    "Hello , world . spaced punctuation ?",
    "",
]


@pytest.fixture(scope="module")
def tok():
  return Tokenizer()


@pytest.fixture(scope="module")
def hf_fast(tmp_path_factory):
  """HF fast tokenizer from the published tokenizer.json (test data copy)."""
  transformers = pytest.importorskip("transformers")
  path = tmp_path_factory.mktemp("hf") / "tokenizer.json"
  with gzip.open(os.path.join(DATA, "t5_tokenizer.json.gz"), "rb") as src:
    path.write_bytes(src.read())
  return transformers.T5TokenizerFast(tokenizer_file=str(path))


@pytest.fixture(scope="module")
def hf_converted(tmp_path_factory):
  """HF tokenizer converted from the bundled spiece.model alone."""
  transformers = pytest.importorskip("transformers")
  d = tmp_path_factory.mktemp("hf_spm")
  shutil.copy(bundled_vocab_path(), d / "spiece.model")
  return transformers.T5Tokenizer.from_pretrained(str(d))


def test_special_ids_and_sizes(tok):
  assert (PAD_ID, EOS_ID, UNK_ID, DECODER_START_ID) == (0, 1, 2, 0)
  assert tok.vocab_size == 32000
  assert tok.num_extra_ids == 100
  assert tok.size_with_extra_ids == 32100
  assert tok.sentinel_id(0) == 32099
  assert tok.sentinel_id(99) == 32000
  with pytest.raises(ValueError):
    tok.sentinel_id(100)


def test_known_ids(tok):
  # From the vocabulary's VERIFY.txt (computed with sentencepiece directly).
  assert tok.encode("question: who wrote hamlet?") == [
      822, 10, 113, 2832, 3, 1483, 1655, 58]


@pytest.mark.parametrize("ref", ["hf_fast", "hf_converted"])
def test_encode_matches_hf_without_eos(tok, ref, request):
  hf = request.getfixturevalue(ref)
  for s in SENTENCES:
    expected = hf(s)["input_ids"]
    assert expected[-1] == EOS_ID
    assert tok.encode(s) == expected[:-1], s
  assert tok.encode_batch(SENTENCES) == [tok.encode(s) for s in SENTENCES]
  assert tok.encode_batch([]) == []


@pytest.mark.parametrize("ref", ["hf_fast", "hf_converted"])
def test_decode_matches_hf(tok, ref, request):
  hf = request.getfixturevalue(ref)
  for s in SENTENCES:
    ids = hf(s)["input_ids"]
    expected = hf.decode(ids, skip_special_tokens=True,
                         clean_up_tokenization_spaces=False)
    got = tok.decode(ids)
    if UNK_ID in ids:
      # Dropping UNK can leave leading spaces, which HF keeps and
      # sentencepiece strips; the words agree.
      got, expected = got.strip(), expected.strip()
    assert got == expected, s
    # Unaffected by padding after EOS and by a decoder-start PAD.
    padded = [DECODER_START_ID] + ids + [PAD_ID] * 3 + [5, 6]
    assert tok.decode(padded) == tok.decode(ids), s


def test_decode_specials(tok):
  hello, world = tok.encode("Hello")[0], tok.encode("world")[0]
  assert tok.decode([hello, world]) == "Hello world"
  # stops at the first EOS
  assert tok.decode([hello, EOS_ID, world]) == "Hello"
  # PAD, UNK, negative ids (label padding) and rows past the sentinels dropped
  assert tok.decode([PAD_ID, hello, UNK_ID, -100, 32100, 32127, world]) == (
      "Hello world")
  # sentinels become <extra_id_N>, as seqio decodes them
  assert tok.decode([tok.sentinel_id(0), hello, tok.sentinel_id(1)]) == (
      "<extra_id_0> Hello <extra_id_1>")
  assert tok.decode([]) == ""
  assert tok.decode(np.array([hello, world, EOS_ID, 0], np.int32)) == (
      "Hello world")
  assert tok.decode_batch(np.array([[hello, EOS_ID], [world, 0]])) == [
      "Hello", "world"]
  with pytest.raises(ValueError):
    tok.decode([[hello]])


def test_sentinel_text_encodes_to_sentinel_id(tok, hf_fast):
  text = "Hello <extra_id_0> world <extra_id_57>"
  ids = tok.encode(text)
  assert ids == hf_fast(text)["input_ids"][:-1]
  assert tok.sentinel_id(0) in ids and tok.sentinel_id(57) in ids
  assert tok.decode(ids) == text


def test_agrees_with_seqio(tok):
  vocab = seqio_vocabulary()
  assert vocab.vocab_size == tok.size_with_extra_ids
  for s in SENTENCES[:8] + ["Hello <extra_id_0> world"]:
    ids = tok.encode(s)
    assert list(vocab.encode(s)) == ids
    if UNK_ID in ids:  # seqio writes UNK as " ⁇ "; jaxfid drops it, as HF
      assert vocab.decode(ids).replace(" ⁇ ", "") == tok.decode(ids)
    else:
      assert vocab.decode(ids) == tok.decode(ids)


def test_encode_padded_truncation_keeps_eos(tok, hf_fast):
  texts = ["who wrote hamlet", "a b c d e f g h i j k l m n", ""]
  out = encode_padded(tok, texts, 6)
  assert out.dtype == np.int32 and out.shape == (3, 6)
  short = tok.encode(texts[0])  # 5 ids: fits exactly with EOS
  assert len(short) == 5
  np.testing.assert_array_equal(out[0], short + [EOS_ID])
  long = tok.encode(texts[1])
  assert len(long) > 6
  np.testing.assert_array_equal(out[1], long[:5] + [EOS_ID])
  np.testing.assert_array_equal(out[2], [EOS_ID, 0, 0, 0, 0, 0])
  # same as HF with truncation + max_length padding
  hf = hf_fast(texts, max_length=6, truncation=True, padding="max_length")
  np.testing.assert_array_equal(out, np.array(hf["input_ids"]))
  no_eos = encode_padded(tok, texts, 6, add_eos=False)
  np.testing.assert_array_equal(no_eos[1], long[:6])
  np.testing.assert_array_equal(no_eos[0], short + [0])
  assert encode_padded(tok, [], 4).shape == (0, 4)
  with pytest.raises(ValueError):
    encode_padded(tok, texts, 0)


def test_load_tokenizer_prefers_checkpoint_vocab(tmp_path):
  assert load_tokenizer().path == bundled_vocab_path()
  assert load_tokenizer(tmp_path).path == bundled_vocab_path()
  own = tmp_path / "spiece.model"
  shutil.copy(bundled_vocab_path(), own)
  assert load_tokenizer(tmp_path).path == str(own)
  assert load_tokenizer(str(tmp_path)).encode("hi") == Tokenizer().encode("hi")


def test_bad_vocab_file_is_input_error(tmp_path):
  bad = tmp_path / "spiece.model"
  bad.write_bytes(b"\xff\xfe definitely not a protobuf \x00\x01")
  with pytest.raises(InputError) as e:
    load_tokenizer(tmp_path)
  assert str(bad) in str(e.value) and "\n" not in str(e.value)
  with pytest.raises(InputError, match="cannot read"):
    Tokenizer(tmp_path / "missing.model")


def test_pickles(tok):
  clone = pickle.loads(pickle.dumps(tok))
  assert clone.path == tok.path
  assert clone.encode(SENTENCES[3]) == tok.encode(SENTENCES[3])
