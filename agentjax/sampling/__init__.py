"""KV-cache sampling: prefill/extend, the jitted decode loop, stop strings, token bytes."""

from agentjax.sampling.sample import SamplingParams, sample_token
from agentjax.sampling.sampler import (STOP_BUDGET, STOP_EOS, STOP_MAX_NEW, STOP_REASONS,
                                       STOP_STRING, DecodeState, Generation, bucket,
                                       decode_layout, extend, generate, init_state,
                                       state_logical_axes)
from agentjax.sampling.stops import StopTable, push_and_match
from agentjax.sampling.text import decode_bytes, token_byte_table

__all__ = [
    "SamplingParams", "sample_token", "STOP_BUDGET", "STOP_EOS", "STOP_MAX_NEW", "STOP_REASONS",
    "STOP_STRING", "DecodeState", "Generation", "bucket", "decode_layout", "extend", "generate",
    "init_state", "state_logical_axes", "StopTable", "push_and_match", "decode_bytes", "token_byte_table",
]
