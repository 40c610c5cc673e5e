"""Multi-turn search-agent rollouts: protocols, the rollout engines, trajectories, turn guides."""

from agentjax.agent.guide import TurnAttempt, TurnGuide, TurnPlan, TurnRows, TurnVerdict
from agentjax.agent.protocol import (ANSWER, INVALID, PROTOCOLS, SEARCH, SEARCH_R1, TOOL_CALL,
                                     Action, Protocol, format_documents, get_protocol)
from agentjax.agent.rollout import (RolloutConfig, RolloutEngine, TurnHook, encode_text,
                                    observation_ids, prompt_ids)
from agentjax.agent.trajectories import (TrajectoryBatch, TrajectoryBook, TurnRecord,
                                         search_stats, transcripts_of)

__all__ = [
    "ANSWER", "INVALID", "PROTOCOLS", "SEARCH", "SEARCH_R1", "TOOL_CALL", "Action", "Protocol",
    "format_documents", "get_protocol", "RolloutConfig", "RolloutEngine", "TrajectoryBatch",
    "TrajectoryBook", "TurnAttempt", "TurnGuide", "TurnHook", "TurnPlan", "TurnRecord",
    "TurnRows", "TurnVerdict", "encode_text", "observation_ids", "prompt_ids", "search_stats",
    "transcripts_of",
]
