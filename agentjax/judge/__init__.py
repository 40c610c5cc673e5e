"""LLM judges of search-agent rounds: one interface, backends openai / local / oracle."""

from agentjax.judge.base import (BUILTIN_JUDGES, JUDGES, Judge, JudgeRequest, Verdict,
                                 build_judge, prompt_sha256, register_judge)

__all__ = ["BUILTIN_JUDGES", "JUDGES", "Judge", "JudgeRequest", "Verdict", "build_judge",
           "prompt_sha256", "register_judge"]
