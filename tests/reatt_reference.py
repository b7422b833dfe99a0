"""A PyTorch reference of ReAtt's training loss, after the original's code.

jzbjyb/FiD (ReAtt's training fork of FiD), ``src/model.py``: the first
``n_layer_two_tower`` encoder layers run with the ``separate`` mask
(question tokens see the question, document tokens the document;
``T5blockWrapper.forward``), the rest with the full row mask; the retrieval
scores are layer n's attention logits of question tokens (queries) over
document tokens (keys), ``all-avg-max`` (``aggregate_attention``: max over
a document's tokens, mean over the question's), mixed over heads by
``softmax(head_weights / tau)`` (``DecoderWrapper``); in-batch, every
question scores every row of the batch (``compute_score_and_aggregate_in_batch``);
the target is the last decoder layer's cross-attention at the first
decoder position, summed over each row's tokens and averaged over heads,
detached (``encoder_decoder_kl``); the loss is ``CE + alpha * KL``
(``KLDivLoss(reduction='batchmean')``).

Written from those descriptions on an HF ``T5ForConditionalGeneration``,
its modules called one by one (attention from the modules' own q/k/v/o
weights, so the block mask needs no HF mask convention). For the parity
test ``tests/test_reatt_vs_reference.py``.
"""
from __future__ import annotations

import torch


def _attention(attn, x, allowed, bias):
  """HF T5Attention's weights on x [N, L, D]; allowed bool [N, L, L]."""
  n, length, _ = x.shape
  heads, width = attn.n_heads, attn.key_value_proj_dim
  q = attn.q(x).view(n, length, heads, width)
  k = attn.k(x).view(n, length, heads, width)
  v = attn.v(x).view(n, length, heads, width)
  logits = torch.einsum("nqhe,nkhe->nhqk", q, k) + bias
  logits = logits.masked_fill(~allowed[:, None], torch.finfo(x.dtype).min)
  weights = torch.softmax(logits.float(), dim=-1).to(x.dtype)
  out = torch.einsum("nhqk,nkhe->nqhe", weights, v).reshape(n, length, -1)
  return attn.o(out)


def _layer(block, x, allowed, bias):
  sa, ff = block.layer[0], block.layer[-1]
  x = x + _attention(sa.SelfAttention, sa.layer_norm(x), allowed, bias)
  return x + ff.DenseReluDense(ff.layer_norm(x))


def reatt_loss(hf, tokens, question_length, decoder_input, targets, *,
               bi_encoder_layers: int, head_weights, tau: float,
               kl_weight: float, position_bias: bool = False) -> dict:
  """``{"loss", "qa_loss", "kl_loss"}`` of one batch, in-batch negatives on.

  Args:
    hf: ``T5ForConditionalGeneration`` in eval mode, ``attn_implementation=
      "eager"`` (dropout off: the loss is deterministic).
    tokens: int64 [B, P, L] rows ``question: Q title: T context: P``.
    question_length: int64 [B], the question prefix of every row.
    decoder_input, targets: int64 [B, T] (targets 0 = padding).
    head_weights: float [H], the head selector's weights.
    position_bias: add layer n's relative position bias to the retrieval
      logits (the original's training path scores raw logits after it).
  """
  b, p, length = tokens.shape
  enc = hf.encoder
  rows = tokens.reshape(b * p, length)
  valid = rows != 0                                               # [N, L]
  pos = torch.arange(length)
  qlen = question_length.repeat_interleave(p)                    # [N]
  in_doc = pos[None, :] >= qlen[:, None]                         # [N, L]
  separate = (in_doc[:, :, None] == in_doc[:, None, :]) & valid[:, None, :]
  full = valid[:, None, :].expand(-1, length, -1)
  bias = enc.block[0].layer[0].SelfAttention.compute_bias(length, length)
  x = enc.embed_tokens(rows)
  for i in range(bi_encoder_layers):
    x = _layer(enc.block[i], x, separate, bias)
  # retrieval attention: layer n's logits, question tokens over doc tokens
  sa = enc.block[bi_encoder_layers].layer[0]
  h = sa.layer_norm(x)
  heads, width = sa.SelfAttention.n_heads, sa.SelfAttention.key_value_proj_dim
  q = sa.SelfAttention.q(h).view(b, p, length, heads, width)[:, 0]  # [B, L, H, E]
  k = sa.SelfAttention.k(h).view(b * p, length, heads, width)      # [N, L, H, E]
  s = torch.einsum("bihe,njhe->bhinj", q, k)
  if position_bias:
    s = s + bias[0][None, :, :, None, :]
  s = s.masked_fill(~(in_doc & valid)[None, None, None], float("-inf"))
  best = s.max(dim=-1).values                                    # [B, H, I, N]
  qmask = (pos[None, :] < question_length[:, None]) & valid.view(b, p, -1)[:, 0]
  per_head = (best * qmask[:, None, :, None]).sum(2) / qmask.sum(1)[:, None, None]
  select = torch.softmax(head_weights / tau, dim=0)
  scores = torch.einsum("bhn,h->bn", per_head, select)           # [B, N]
  # the cross-encoder and the decoder
  for i in range(bi_encoder_layers, len(enc.block)):
    x = _layer(enc.block[i], x, full, bias)
  hidden = enc.final_layer_norm(x).reshape(b, p * length, -1)
  mask = valid.reshape(b, p * length)
  out = hf(encoder_outputs=(hidden,), attention_mask=mask.long(),
           decoder_input_ids=decoder_input, output_attentions=True,
           use_cache=False)
  logp = torch.log_softmax(out.logits.float(), dim=-1)
  nll = -logp.gather(-1, targets[..., None])[..., 0]
  real = targets > 0
  qa_loss = nll[real].sum() / real.sum()
  cross = out.cross_attentions[-1][:, :, 0, :]                   # [B, H, P*L]
  target = cross.reshape(b, heads, p, length).sum(-1).mean(1).detach()  # [B, P]
  full_target = torch.zeros(b, b * p)
  for i in range(b):
    full_target[i, i * p:(i + 1) * p] = target[i]
  log_ret = torch.log_softmax(scores, dim=-1)
  kl = torch.nn.functional.kl_div(log_ret, full_target, reduction="batchmean")
  return {"loss": qa_loss + kl_weight * kl, "qa_loss": qa_loss,
          "kl_loss": kl}
