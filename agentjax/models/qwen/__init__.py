"""Qwen2 / Qwen2.5 / Qwen3: config, linen model and Hugging Face checkpoint interop."""

from agentjax.models.qwen.config import PRESETS, ConfigError, QwenConfig
from agentjax.models.qwen.model import (KVCache, Qwen, abstract_params, adapter_abstract,
                                        adapter_shardings, init_adapters, init_params,
                                        param_logical_axes, param_shardings)
from agentjax.models.qwen.value import (QwenValue, init_value_head, load_value_hf, save_value_hf,
                                        sequence_values, value_abstract, value_logical_axes,
                                        value_params_from_policy, value_params_with_adapter,
                                        value_shardings)

__all__ = ["PRESETS", "ConfigError", "QwenConfig", "KVCache", "Qwen", "abstract_params",
           "adapter_abstract", "adapter_shardings", "init_adapters", "init_params",
           "param_logical_axes", "param_shardings", "QwenValue", "init_value_head",
           "load_value_hf", "save_value_hf", "sequence_values", "value_abstract",
           "value_logical_axes", "value_params_from_policy", "value_params_with_adapter",
           "value_shardings"]
