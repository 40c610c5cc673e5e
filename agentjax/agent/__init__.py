"""Multi-turn search-agent rollouts: protocols and the rollout engine."""

from agentjax.agent.protocol import (ANSWER, INVALID, PROTOCOLS, SEARCH, SEARCH_R1, TOOL_CALL,
                                     Action, Protocol, format_documents, get_protocol)
from agentjax.agent.rollout import (RolloutConfig, RolloutEngine, TrajectoryBatch, TurnHook,
                                    TurnRecord, encode_text, observation_ids, prompt_ids,
                                    transcripts_of)

__all__ = [
    "ANSWER", "INVALID", "PROTOCOLS", "SEARCH", "SEARCH_R1", "TOOL_CALL", "Action", "Protocol",
    "format_documents", "get_protocol", "RolloutConfig", "RolloutEngine", "TrajectoryBatch",
    "TurnHook", "TurnRecord", "encode_text", "observation_ids", "prompt_ids", "transcripts_of",
]
