"""Shared fixtures: tiny random Hugging Face checkpoints and tokenizers, built locally.

There is no model hub here: transformers itself writes random checkpoints, and the `tokenizers`
library trains a small byte-level BPE.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import pytest  # noqa: E402

from tests import hf_fixtures  # noqa: E402


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory):
  """A byte-level BPE tokenizer folder with a Qwen-style chat template."""
  return hf_fixtures.make_tokenizer_dir(str(tmp_path_factory.mktemp("tokenizer")))


@pytest.fixture(scope="session")
def hf_checkpoint(tmp_path_factory):
  """Factory: hf_checkpoint(name) -> (folder, transformers model in eval mode), cached per name."""
  cache = {}

  def build(name: str, **save_kwargs):
    key = (name, tuple(sorted(save_kwargs.items())))
    if key not in cache:
      folder = str(tmp_path_factory.mktemp(name))
      cache[key] = (folder, hf_fixtures.make_checkpoint(name, folder, **save_kwargs))
    return cache[key]

  return build
