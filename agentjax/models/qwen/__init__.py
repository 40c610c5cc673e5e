"""Qwen2 / Qwen2.5 / Qwen3: config, linen model and Hugging Face checkpoint interop."""

from agentjax.models.qwen.config import PRESETS, ConfigError, QwenConfig
from agentjax.models.qwen.model import (KVCache, Qwen, abstract_params, adapter_abstract,
                                        adapter_shardings, init_adapters, init_params,
                                        param_logical_axes, param_shardings)

__all__ = ["PRESETS", "ConfigError", "QwenConfig", "KVCache", "Qwen", "abstract_params",
           "adapter_abstract", "adapter_shardings", "init_adapters", "init_params",
           "param_logical_axes", "param_shardings"]
