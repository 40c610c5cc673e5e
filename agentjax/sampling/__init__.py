"""KV-cache sampling: prefill/extend, the jitted decode loop, stop strings, token bytes."""

from agentjax.sampling.sample import SamplingParams, sample_token, sample_token_rows
from agentjax.sampling.sampler import (STOP_BUDGET, STOP_EOS, STOP_MAX_NEW, STOP_REASONS,
                                       STOP_STRING, DecodeState, Generation, bucket, cache_size,
                                       decode_layout, extend, generate, init_state,
                                       kv_window_arg, kv_window_size, state_logical_axes)
from agentjax.sampling.slots import (DecodeCall, SlotProgress, Trajectories, copy_rows,
                                     decode_slots, empty_trajectories, extend_rows, init_progress,
                                     store_rows, take_rows)
from agentjax.sampling.stops import StopTable, push_and_match
from agentjax.sampling.text import decode_bytes, token_byte_table

__all__ = [
    "SamplingParams", "sample_token", "sample_token_rows", "STOP_BUDGET", "STOP_EOS",
    "STOP_MAX_NEW", "STOP_REASONS", "STOP_STRING", "DecodeState", "Generation", "bucket",
    "cache_size",
    "decode_layout", "extend", "generate", "init_state", "state_logical_axes", "StopTable",
    "push_and_match", "decode_bytes", "token_byte_table", "DecodeCall", "SlotProgress",
    "Trajectories", "copy_rows", "decode_slots", "empty_trajectories", "extend_rows",
    "init_progress", "store_rows", "take_rows", "kv_window_arg", "kv_window_size",
]
