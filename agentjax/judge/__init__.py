"""LLM judges of search-agent rounds: one interface, backends openai / local / oracle."""

from agentjax.judge.base import (BUILTIN_JUDGES, DEFAULT_PROMPT_PATH, JUDGES, Judge,
                                 JudgeRequest, Verdict, build_judge, judge_identity, load_prompt,
                                 prompt_sha256, register_judge)

__all__ = ["BUILTIN_JUDGES", "DEFAULT_PROMPT_PATH", "JUDGES", "Judge", "JudgeRequest", "Verdict",
           "build_judge", "judge_identity", "load_prompt", "prompt_sha256", "register_judge"]
