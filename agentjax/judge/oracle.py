"""SynthWorld's oracle judge: per-round verdicts from the question's gold evidence chain.

    judge = build_judge(config.judge)                    # judge.backend = "oracle"
    verdicts = judge.judge([JudgeRequest(question, turns), ...])
    verdicts = oracle_verdicts(question, turns)         # the same rule, as a pure function

A SynthWorld question record carries "chain" (entity names, subject first, answer last) and
"hops" (H). The passage of chain[h] states the relation from chain[h] to chain[h+1], so the
evidence needed to answer is the H passages of chain[0..H-1]: the GOLD-CHAIN documents. A
document is the gold document of hop h iff its title (Document.title with surrounding double
quotes stripped), normalized like answers (agentjax.answers.normalize_answer, "standard":
lowercase, punctuation deleted, articles dropped, whitespace collapsed), equals chain[h]
normalized the same way. The answer entity's own passage (chain[H]) is not gold: it states
nothing the question needs. Documents are identified by title, not id (the CW-GRPO judge prompt:
documents with the same title are one entry).

Our reading of the CW-GRPO judge's criteria (CW-GRPO, arXiv:2604.14267; the official prompt is
verl/workers/reward_manager/llm_judge.py JUDGE_PROMPT) on SynthWorld (config judge.backend =
"oracle"). Hop h is RESOLVED after round k iff a gold document of hop h was retrieved in some
round <= k. For round k:

  search round   retrieval = 1 iff round k retrieved a gold document of a hop not resolved before
                   round k (relevant AND new; a gold document seen in an earlier round, or a
                   second copy within round k of one already counted, adds nothing more).
                 thinking = 1 iff the round's query, cleaned (agentjax.agent.protocol.clean_text)
                   and normalized as above, mentions chain[h] (as whole words) for some hop h < H
                   not resolved before round k: the search targets missing evidence. A query
                   about an already-resolved hop, about the answer entity, or about nothing in
                   the chain gets 0. A search that failed (search_error) is judged the same way:
                   it retrieved nothing (retrieval 0), its query is still judged.
  answer round   retrieval = 0 (an answer retrieves nothing).
                 thinking = 1 iff every hop was resolved before the round (the answer is
                   supported by retrieved evidence); an early answer gets 0, whatever it says
                   (the judge does not compare the answer with the gold one).
  invalid round  0/0, as a real verdict (ok=True): the round did no useful work.

The rule does not check that a query naming chain[h], h >= 1, was grounded in the passage of
chain[h-1] (a query can only name a bridge entity by guessing or by having read it; both count).

A request whose question lacks "chain"/"hops" (not SynthWorld) or has malformed ones gives
Verdict.failed for every round, which the trainer counts as judge failures.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from agentjax.agent.protocol import ANSWER, SEARCH, normalize_text
from agentjax.agent.trajectories import TurnRecord
from agentjax.judge.base import JudgeRequest, Verdict, register_judge

ORACLE_IDENTITY = {"backend": "oracle", "model": "synthworld-gold-chain", "prompt_sha256": "-"}

MISSING_CHAIN = "oracle needs a SynthWorld question (chain)"




def title_key(title: str) -> str:
  """A document title as compared with chain names: quotes stripped, normalized."""
  title = title.strip()
  if len(title) >= 2 and title[0] == title[-1] == '"':
    title = title[1:-1]
  return normalize_text(title)


def gold_chain(question: Mapping[str, Any]) -> tuple[list[str], str | None]:
  """(normalized names of chain[0..H-1], None), or ([], why the record is unusable)."""
  if not isinstance(question, Mapping) or "chain" not in question or "hops" not in question:
    return [], MISSING_CHAIN
  chain, hops = question["chain"], question["hops"]
  if isinstance(chain, (str, bytes)) or not all(isinstance(n, str) for n in chain):
    return [], f"{MISSING_CHAIN}: 'chain' must be a list of str, got {chain!r}"
  chain = list(chain)
  try:
    hops = int(hops)
  except (TypeError, ValueError):
    return [], f"{MISSING_CHAIN}: 'hops' must be an int, got {hops!r}"
  if not 1 <= hops <= len(chain) or not all(normalize_text(n) for n in chain[:hops]):
    return [], (f"{MISSING_CHAIN}: 'hops'={hops} needs {hops} non-empty names in 'chain', "
                f"got {chain!r}")
  return [normalize_text(n) for n in chain[:hops]], None


def hop_index(gold: Sequence[str]) -> dict[str, int]:
  """{normalized gold name: its hop} (gold_chain's names); a repeated name (never in SynthWorld)
  resolves its first hop."""
  hop_of: dict[str, int] = {}
  for h, name in enumerate(gold):
    hop_of.setdefault(name, h)
  return hop_of


def resolve(hop_of: Mapping[str, int], resolved: list[bool],
            documents: Sequence[Any]) -> list[int]:
  """The resolution rule: marks (in place) the hops whose gold document is among `documents`
  (by title_key) as resolved; returns the hops newly resolved, in the order found."""
  new = []
  for doc in documents:
    h = hop_of.get(title_key(doc.title))
    if h is not None and not resolved[h]:
      resolved[h] = True
      new.append(h)
  return new


def new_gold_per_turn(question: Mapping[str, Any], turns: Sequence[Any]) -> np.ndarray:
  """[len(turns)] bool: turn t's retrieved documents include the gold document of a hop no
  earlier turn resolved (`resolve`, by title). All False without a gold chain."""
  gold, error = gold_chain(question)
  out = np.zeros(len(turns), bool)
  if error is not None:
    return out
  hop_of, resolved = hop_index(gold), [False] * len(gold)
  for t, turn in enumerate(turns):
    out[t] = bool(resolve(hop_of, resolved, getattr(turn, "documents", ()) or ()))
  return out


def ig_pairs(ig: np.ndarray, num_turns: np.ndarray, questions: Sequence[Mapping[str, Any]],
             turns: Sequence[Sequence[Any]]) -> tuple[list[float], list[bool]]:
  """(IG, new gold) of every non-answer turn k < num_turns[b] - 1 of every row (the turns IGPO
  gives an information gain). ig: [B, T]; questions and turns: B each."""
  gains, hits = [], []
  for b, q in enumerate(questions):
    new = new_gold_per_turn(q, turns[b])
    for k in range(int(num_turns[b]) - 1):
      gains.append(float(ig[b, k]))
      hits.append(bool(new[k]))
  return gains, hits


# A step's IG-vs-new-gold pairs as sums, pooled over steps and seeds by ig_gold_summary (a
# per-step correlation of a few dozen turns would be mostly noise).
IG_GOLD_SUMS = ("ig_gold/turns", "ig_gold/new_gold", "ig_gold/sum_ig", "ig_gold/sum_ig_sq",
                "ig_gold/sum_ig_new_gold")


def ig_gold_sums(gains: Sequence[float], hits: Sequence[bool]) -> dict[str, float]:
  """The sufficient statistics of Pearson's r between IG and the new-gold bit (IG_GOLD_SUMS)."""
  x, y = np.asarray(gains, np.float64), np.asarray(hits, np.float64)
  return dict(zip(IG_GOLD_SUMS, map(float, (x.size, y.sum(), x.sum(), (x * x).sum(),
                                            (x * y).sum()))))


def ig_gold_summary(rows: Sequence[Mapping[str, float]]) -> dict[str, float]:
  """Pooled over `rows` (steps' metrics holding IG_GOLD_SUMS): {"turns", "new_gold_share", "r"
  (point-biserial: Pearson's r of IG with the bit), "ig_new_gold", "ig_other" (mean IG of each
  kind of turn)}; nan where undefined (no turns, one kind only, constant IG)."""
  n, k, sx, sxx, sxy = (float(sum(r.get(key, 0.0) for r in rows)) for key in IG_GOLD_SUMS)
  nan = float("nan")
  if n == 0:
    return {"turns": 0.0, "new_gold_share": nan, "r": nan, "ig_new_gold": nan, "ig_other": nan}
  var_x, var_y = n * sxx - sx * sx, n * k - k * k  # n^2 times the population variances
  cov = n * sxy - sx * k
  r = cov / np.sqrt(var_x * var_y) if var_x > 1e-12 * max(n * sxx, 1e-300) and var_y > 0 else nan
  return {"turns": n, "new_gold_share": k / n, "r": float(r),
          "ig_new_gold": sxy / k if k else nan, "ig_other": (sx - sxy) / (n - k) if n > k else nan}


def _mentions(query: str, name: str) -> bool:
  """Whether the normalized `name` occurs in the normalized `query` as whole words."""
  return f" {name} " in f" {query} "


def oracle_verdicts(question: Mapping[str, Any], turns: Sequence[TurnRecord]) -> list[Verdict]:
  """The oracle's verdict of every round of one trajectory (see the module docstring).

  Args:
    question: a SynthWorld question record ("chain", "hops"; others ignored).
    turns: the trajectory's rounds in order.
  Returns:
    len(turns) Verdicts; all Verdict.failed when the question has no usable gold chain.
  """
  gold, error = gold_chain(question)
  if error is not None:
    return [Verdict.failed(error) for _ in turns]
  hop_of = hop_index(gold)
  resolved = [False] * len(gold)
  out = []
  for k, turn in enumerate(turns):
    kind = turn.action.kind
    if kind == SEARCH:
      query = normalize_text(turn.action.content)
      targets = [h for h, name in enumerate(gold) if not resolved[h] and _mentions(query, name)]
      new = resolve(hop_of, resolved, turn.documents)
      retrieval, thinking = int(bool(new)), int(bool(targets))
      analysis = (f"round {k} search: targets unresolved hops {targets}; retrieved new gold "
                  f"hops {sorted(new)}; resolved {sum(resolved)}/{len(gold)}")
    elif kind == ANSWER:
      retrieval, thinking = 0, int(all(resolved))
      analysis = (f"round {k} answer: {sum(resolved)}/{len(gold)} hops resolved before it "
                  f"({'supported' if thinking else 'unsupported'})")
    else:
      retrieval, thinking = 0, 0
      analysis = f"round {k} invalid action"
    out.append(Verdict(retrieval, thinking, analysis))
  return out


class OracleJudge:
  """The oracle as a Judge backend (host side, text only, no model)."""

  def judge(self, requests: Sequence[JudgeRequest]) -> list[list[Verdict]]:
    return [oracle_verdicts(r.question, r.turns) for r in requests]

  def identity(self) -> dict[str, str]:
    return dict(ORACLE_IDENTITY)


@register_judge("oracle")
def make_oracle_judge(judge_config: Any = None, *, mesh: Any = None) -> OracleJudge:
  """The "oracle" backend; it reads no settings (judge_config and mesh are unused)."""
  del judge_config, mesh
  return OracleJudge()
