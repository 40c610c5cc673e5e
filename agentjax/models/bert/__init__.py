"""BERT-family text encoders (e5, bge): a Flax port that matches transformers' BertModel, pooled
into one embedding per text for dense retrieval (agentjax/retrieval/dense.py)."""

from agentjax.models.bert.checkpoint import load_hf, params_from_tensors, save_hf
from agentjax.models.bert.config import POOLINGS, BertConfig
from agentjax.models.bert.model import (Bert, abstract_params, encode, init_params,
                                        param_logical_axes, param_shardings, pool)

__all__ = ["Bert", "BertConfig", "POOLINGS", "abstract_params", "encode", "init_params",
           "load_hf", "param_logical_axes", "param_shardings", "params_from_tensors", "pool",
           "save_hf"]
