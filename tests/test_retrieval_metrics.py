"""Answer matching, answer recall and qrels metrics against known values."""
import pytest

from jaxfid.core.errors import InputError
from jaxfid.retrieval.text.answer_match import (
    AnswerMatcher, PreparedCache, dpr_tokens, has_answer)
from jaxfid.evaluation.retrieval import (
    answer_recall, evaluate_run, mrr_at_k, ndcg_at_k, read_qrels, recall_at_k)
from jaxfid.retrieval.runs import read_trec_run


def test_dpr_tokenizer():
  assert dpr_tokens("U.S. Army's 2nd-best, café!") == [
      "u", ".", "s", ".", "army", "'", "s", "2nd", "-", "best", ",",
      "cafe\u0301", "!"]


@pytest.mark.parametrize("answers, text, expected", [
    (["Denver Broncos"], "The DENVER broncos won.", True),
    (["Bronco"], "Denver Broncos", False),  # whole tokens, not substrings
    (["U.S."], "the u.s. army", True),
    (["café"], "un cafe\u0301 noir", True),  # NFD on both sides
    (["cafe"], "un café noir", False),  # accents are kept
    (["nope", "noir"], "un café noir", True),  # any answer
    (["Denver Broncos"], "Broncos Denver", False),  # order matters
    ([""], "anything", False),  # empty answers never match
    ([], "anything", False),
    (["οδος"], "ΟΔΟΣ'A", True),  # tokens lowercase alone (final sigma)
])
def test_has_answer(answers, text, expected):
  assert has_answer(answers, text) is expected
  cache = PreparedCache(max_size=1)
  matcher = AnswerMatcher(answers)
  assert matcher(cache.get("k", text)) is expected
  assert matcher(cache.get("k", text)) is expected  # cached


def test_answer_recall_known_values():
  hits = [[False, True, False], [True], [False, False, False, True], []]
  assert answer_recall(hits, [1, 2, 4, 100]) == {
      "R@1": 0.25, "R@2": 0.5, "R@4": 0.75, "R@100": 0.75}
  assert answer_recall([], [1]) == {"R@1": 0.0}


def test_ndcg_mrr_recall_known_values():
  judged = {"d1": 2, "d2": 1, "d3": 0, "d4": 1}
  ranked = ["d3", "d1", "d5", "d2"]
  # DCG = 2/log2(3) + 1/log2(5) = 1.2618595 + 0.4306766 = 1.6925361
  # IDCG = 2/1 + 1/log2(3) + 1/log2(4) = 3.1309298
  assert ndcg_at_k(ranked, judged, 10) == pytest.approx(0.5405860, abs=1e-6)
  # cut at 2: DCG = 1.2618595; IDCG = 2 + 0.6309298 = 2.6309298
  assert ndcg_at_k(ranked, judged, 2) == pytest.approx(0.4796249, abs=1e-6)
  assert mrr_at_k(ranked, judged, 10) == 0.5
  assert mrr_at_k(ranked, judged, 1) == 0.0
  assert recall_at_k(ranked, judged, 100) == pytest.approx(2 / 3)
  assert recall_at_k(ranked, judged, 2) == pytest.approx(1 / 3)
  assert recall_at_k(ranked, {"d3": 0}, 10) == 0.0
  assert ndcg_at_k(ranked, {"d3": 0}, 10) == 0.0


def test_evaluate_run_averages_over_run_and_qrels():
  qrels = {"q1": {"d1": 2, "d2": 1, "d3": 0, "d4": 1}, "q2": {"d9": 1},
           "q3": {"d1": 1}}
  run = {"q1": [("d3", 4.0), ("d1", 3.0), ("d5", 2.0), ("d2", 1.0)],
         "q2": [("d9", 1.0)], "q4": [("d1", 1.0)]}
  out = evaluate_run(run, qrels)
  assert out["nDCG@10"] == pytest.approx((0.5405860 + 1) / 2, abs=1e-6)
  assert out["MRR@10"] == pytest.approx(0.75)
  assert out["R@100"] == pytest.approx((2 / 3 + 1) / 2)
  assert out["num_queries"] == 2 and out["queries_without_results"] == 1


def test_read_qrels_trec_and_beir(tmp_path):
  trec = tmp_path / "qrels.txt"
  trec.write_text("q1 0 d1 2\nq1 0 d2 0\nq2 0 d3 1\n")
  assert read_qrels(trec) == {"q1": {"d1": 2, "d2": 0}, "q2": {"d3": 1}}
  beir = tmp_path / "test.tsv"
  beir.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
  assert read_qrels(beir) == {"q1": {"d1": 1}}
  bad = tmp_path / "bad.txt"
  bad.write_text("q1 0 d1 1\nq1 d2\n")
  with pytest.raises(InputError, match=r"bad.txt:2: "):
    read_qrels(bad)


def test_read_trec_run_orders(tmp_path):
  path = tmp_path / "run.trec"
  path.write_text("q1 Q0 a 1 2.0 t\nq1 Q0 c 2 1.0 t\nq1 Q0 b 3 1.0 t\n"
                  "q1 Q0 z 4 5.0 t\n")
  # trec_eval: score descending, then docid descending; ranks ignored
  assert [d for d, _ in read_trec_run(path)["q1"]] == ["z", "a", "c", "b"]
  assert [d for d, _ in read_trec_run(path, order="rank")["q1"]] == [
      "a", "c", "b", "z"]
  path.write_text("q1 Q0 a 1 2.0\n")
  with pytest.raises(InputError, match=r"run.trec:1: expected 6 columns"):
    read_trec_run(path)
  path.write_text("q1 Q0 a 1 2.0 t\nq1 Q0 a 2 1.0 t\n")
  with pytest.raises(InputError, match=r"run.trec:2: document 'a' listed"):
    read_trec_run(path)
