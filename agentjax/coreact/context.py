"""A branch point of a search agent's trajectory: what Co-ReAct's pieces read (host side, text).

    ctx = BranchContext(question=record, turns=turns, max_calls=4, protocol="search_r1")
    ctx.tool_calls          # searches made so far (the phase hint's clock)
    row = ctx.to_json(); BranchContext.from_json(row) == ctx

The same context serves every stage: branch collection (launch/collect_branches.py writes it
with the candidates and the judges' rankings), the rubric generator's prompt and reward (training),
the rubric applier (ranking candidates, verify scores) and the guided agent at inference (built
from the rollout's TurnRecords before each step after the first).

question: the question record ("question", "golden_answers"; SynthWorld's also "chain", "hops",
  which only the oracle ranker reads: nothing a rubric or its applier sees uses them).
turns: the trajectory so far (agentjax.agent.TurnRecord: generated text, parsed action,
  documents, observation), in order.
max_calls: the agent's turn budget (rollout.max_turns): the phase hint's denominator.
protocol: the agent's rollout protocol name (how candidate action texts are parsed).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from agentjax.agent.protocol import SEARCH, Action, get_protocol, parse_action
from agentjax.agent.trajectories import TurnRecord
from agentjax.retrieval import Document


@dataclasses.dataclass(frozen=True)
class BranchContext:
  question: Mapping[str, Any]
  turns: tuple[TurnRecord, ...]
  max_calls: int
  protocol: str = "search_r1"

  @property
  def tool_calls(self) -> int:
    """Searches made so far (failed ones included: the agent spent the call)."""
    return sum(t.action.kind == SEARCH for t in self.turns)

  @property
  def step(self) -> int:
    """The 0-based index of the step about to be taken (= turns done)."""
    return len(self.turns)

  def parse(self, text: str) -> Action:
    """A candidate action's text parsed with the agent's protocol (never raises)."""
    return parse_action(get_protocol(self.protocol), text)

  def to_json(self) -> dict[str, Any]:
    return {"question": dict(self.question), "turns": [turn_to_json(t) for t in self.turns],
            "max_calls": int(self.max_calls), "protocol": self.protocol}

  @classmethod
  def from_json(cls, row: Mapping[str, Any]) -> "BranchContext":
    """Raises ValueError naming the field when the row is malformed."""
    for key in ("question", "turns", "max_calls"):
      if key not in row:
        raise ValueError(f"branch context: missing field {key!r}")
    if not isinstance(row["turns"], list):
      raise ValueError(f"branch context: 'turns' must be a list, got {type(row['turns']).__name__}")
    turns = tuple(turn_from_json(t, where=f"turns[{i}]") for i, t in enumerate(row["turns"]))
    protocol = str(row.get("protocol", "search_r1"))
    get_protocol(protocol)
    return cls(question=dict(row["question"]), turns=turns, max_calls=int(row["max_calls"]),
               protocol=protocol)


def turn_to_json(turn: TurnRecord) -> dict[str, Any]:
  return {"text": turn.text, "action": {"kind": turn.action.kind, "content": turn.action.content},
          "documents": [{"id": d.id, "contents": d.contents, "score": float(d.score)}
                        for d in turn.documents],
          "observation": turn.observation, "search_error": turn.search_error,
          "hook_text": turn.hook_text, "shadow_text": turn.shadow_text}


def turn_from_json(row: Mapping[str, Any], where: str = "turn") -> TurnRecord:
  """Raises ValueError naming `where` and the field when the row is malformed."""
  try:
    action = row["action"]
    docs = tuple(Document(id=str(d["id"]), contents=str(d["contents"]),
                          score=float(d.get("score", 0.0))) for d in row.get("documents", ()))
    return TurnRecord(text=str(row["text"]), action=Action(str(action["kind"]),
                                                          str(action.get("content", ""))),
                      documents=docs, observation=str(row.get("observation", "")),
                      search_error=row.get("search_error"),
                      hook_text=str(row.get("hook_text", "")),
                      shadow_text=str(row.get("shadow_text", "")))
  except (KeyError, TypeError, AttributeError) as e:
    raise ValueError(f"branch context: {where}: malformed turn ({type(e).__name__}: {e})") \
        from None


def contexts_of(questions: Sequence[Mapping[str, Any]], histories: Sequence[Sequence[TurnRecord]],
                max_calls: int, protocol: str) -> list[BranchContext]:
  """One BranchContext per row from the rollout's per-row question records and turns so far."""
  return [BranchContext(question=q, turns=tuple(h), max_calls=max_calls, protocol=protocol)
          for q, h in zip(questions, histories)]
