"""Qwen3-Embedding through the Qwen port (agentjax/models/qwen/embedding.py) against transformers'
Qwen3Model with the model card's last-token pooling: left and right padding, a Qwen3Model folder
(no "model." prefix) and a causal LM folder, the query format."""

from __future__ import annotations

import numpy as np
import pytest

from agentjax.models.qwen.embedding import embed, load_embedding_hf, query_text

TINY = dict(vocab_size=400, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=1_000_000.0,
            tie_word_embeddings=False)


@pytest.fixture(scope="module")
def qwen3_model(tmp_path_factory):
  import torch
  from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3Model
  torch.manual_seed(0)
  model = Qwen3Model(Qwen3Config(**TINY)).eval()
  folder = str(tmp_path_factory.mktemp("qwen3_embedding"))
  model.save_pretrained(folder, safe_serialization=True)
  lm = Qwen3ForCausalLM(Qwen3Config(**TINY)).eval()
  lm.model.load_state_dict(model.state_dict())
  lm_folder = str(tmp_path_factory.mktemp("qwen3_lm"))
  lm.save_pretrained(lm_folder, safe_serialization=True)
  return folder, lm_folder, model


def _card_embeddings(model, tokens, valid):
  """The model card's last_token_pool and normalize, in torch."""
  import torch
  mask = torch.tensor(valid, dtype=torch.long)
  with torch.no_grad():
    hidden = model(input_ids=torch.tensor(tokens, dtype=torch.long), attention_mask=mask
                   ).last_hidden_state
  left_padding = bool(mask[:, -1].sum() == mask.shape[0])
  if left_padding:
    out = hidden[:, -1]
  else:
    lengths = mask.sum(dim=1) - 1
    out = hidden[torch.arange(hidden.shape[0]), lengths]
  return torch.nn.functional.normalize(out, p=2, dim=1).numpy()


@pytest.mark.parametrize("side", ["left", "right"])
def test_last_token_embeddings_match_the_model_card(qwen3_model, side):
  folder, lm_folder, model = qwen3_model
  rng = np.random.default_rng(0)
  lengths = np.array([12, 5, 9])
  tokens = rng.integers(1, TINY["vocab_size"], (3, 12)).astype(np.int32)
  pos = np.arange(12)[None]
  valid = pos < lengths[:, None] if side == "right" else pos >= 12 - lengths[:, None]
  tokens = np.where(valid, tokens, 0).astype(np.int32)
  want = _card_embeddings(model, tokens, valid)
  for path in (folder, lm_folder):  # a Qwen3Model folder, and a causal LM's (lm_head unread)
    cfg, params = load_embedding_hf(path)
    assert "lm_head" not in params
    got = np.asarray(embed(cfg, params, tokens, valid))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_query_format_is_the_cards():
  assert query_text("who wrote hamlet") == (
      "Instruct: Given a web search query, retrieve relevant passages that answer the query\n"
      "Query:who wrote hamlet")


def test_a_qwen3_embedding_folder_indexes_and_searches(qwen3_model, tmp_path):
  """The dense index's encoder takes a Qwen3-Embedding folder (last-token pooling, the folder's
  own tokenizer): the index holds the card's embeddings of the passages, and the backend finds a
  passage by its own text."""
  import json
  import shutil
  from agentjax.retrieval.dense_index import DenseBackend, TextEncoder, build_dense_index
  from tests.hf_fixtures import make_tokenizer_dir
  folder, _, model = qwen3_model
  encoder_dir = tmp_path / "encoder"
  shutil.copytree(folder, encoder_dir)
  make_tokenizer_dir(str(encoder_dir))
  texts = [f"the {w} stands by the {v}" for w in ("mill", "tower", "gate") for v in ("sea", "road")]
  corpus = tmp_path / "corpus.jsonl"
  corpus.write_text("".join(json.dumps({"id": i, "contents": t}) + "\n"
                            for i, t in enumerate(texts)))
  encoder = TextEncoder(str(encoder_dir), batch_size=4)
  build_dense_index(str(corpus), encoder, str(tmp_path / "index"), passage_prefix="")
  from agentjax.retrieval.dense_index import load_embeddings
  manifest, emb = load_embeddings(str(tmp_path / "index"))
  assert manifest["pooling"] == "last"
  ids = [encoder.tokenizer(t)["input_ids"] for t in texts]
  for i, row in enumerate(ids):
    want = _card_embeddings(model, np.array([row], np.int32), np.ones((1, len(row)), bool))
    np.testing.assert_allclose(emb[i], want[0], rtol=1e-5, atol=1e-6)
  backend = DenseBackend(str(tmp_path / "index"), encoder=encoder, query_prefix="")
  assert backend.search([texts[4]], 1).documents[0][0].id == "4"
