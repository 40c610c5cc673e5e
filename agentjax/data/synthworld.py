"""SynthWorld: a procedurally generated knowledge world, its corpus, multi-hop questions and demos.

A world is drawn from a seed. Its entities have invented, pronounceable names built from
syllables (so no model can know an answer without searching), and four types linked by six
functional relations (each subject has exactly one object):

  person        --born_in-->           city
  person        --works_for-->         organization
  city          --located_in-->        country
  country       --capital-->           city          (a city located in that country)
  organization  --founded_by-->        person
  organization  --headquartered_in-->  city

Because every relation is functional, a question "follow relations r1..rn from subject s" has
exactly one answer. Questions follow the paths of `QUESTION_TEMPLATES` (1, 2 and 3 hops) and
are kept only when the chain visits distinct entities (no "capital of the country of its own
capital" loops). Train/dev/test questions start from disjoint subject entities.

The corpus holds one passage per entity in FlashRAG format,
`{"id", "contents": "\\"Name\\"\\n..."}`, stating the entity's outgoing relations in plain
sentences. A demonstration replays, for a training question, the text an agent would write in a
rollout protocol (Search-R1 by default): one search per hop with a query that BM25 answers, the
observation exactly as the protocol renders the backend's documents, and a final answer. With
`stop_early_rate`, a share of the multi-hop demonstrations stops early and answers the bridge
entity (a hasty teacher, whose shortcut RL then has to unlearn); see `SynthWorld.demonstrations`.

    world = SynthWorld.generate(seed=0, n_entities=2000, n_train=4000, n_dev=500, n_test=500)
    paths = world.write("data/manual/synthworld", topk=3)   # corpus, splits, demos, entities

The split files are FlashRAG QA JSONL (plus "hops", "chain", "relations"), so the tfds builder
`agentjax.data.searchqa.SearchQA` (config "synthworld") reads that folder like any benchmark.

Randomness comes from one `random.Random(seed)` consumed in a fixed order (no set or hash
iteration), so a seed gives the same world, questions and files on every run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
from typing import Any, Sequence

from agentjax.agent.protocol import SEARCH_R1, Protocol
from agentjax.retrieval import Document, SearchBackend

PERSON, CITY, COUNTRY, ORGANIZATION = "person", "city", "country", "organization"
ENTITY_TYPES = (PERSON, CITY, COUNTRY, ORGANIZATION)

# relation -> (subject type, object type). Every relation is functional: one object per subject.
RELATIONS: dict[str, tuple[str, str]] = {
    "born_in": (PERSON, CITY),
    "works_for": (PERSON, ORGANIZATION),
    "located_in": (CITY, COUNTRY),
    "capital": (COUNTRY, CITY),
    "founded_by": (ORGANIZATION, PERSON),
    "headquartered_in": (ORGANIZATION, CITY),
}

# Relation path -> question about its start entity {s}. The answer is the path's last object.
QUESTION_TEMPLATES: dict[tuple[str, ...], str] = {
    ("born_in",): "Where was {s} born?",
    ("works_for",): "Which organization does {s} work for?",
    ("located_in",): "In which country is {s} located?",
    ("capital",): "What is the capital of {s}?",
    ("founded_by",): "Who founded {s}?",
    ("headquartered_in",): "In which city is {s} headquartered?",
    ("born_in", "located_in"): "In which country was {s} born?",
    ("works_for", "founded_by"): "Who founded the organization that {s} works for?",
    ("works_for", "headquartered_in"):
        "In which city is the organization that {s} works for headquartered?",
    ("located_in", "capital"): "What is the capital of the country in which {s} is located?",
    ("founded_by", "born_in"): "Where was the founder of {s} born?",
    ("headquartered_in", "located_in"): "In which country is {s} headquartered?",
    ("born_in", "located_in", "capital"): "What is the capital of the country where {s} was born?",
    ("works_for", "founded_by", "born_in"):
        "Where was the founder of the organization that {s} works for born?",
    ("works_for", "headquartered_in", "located_in"):
        "In which country is the organization that {s} works for headquartered?",
    ("founded_by", "born_in", "located_in"): "In which country was the founder of {s} born?",
    ("headquartered_in", "located_in", "capital"):
        "What is the capital of the country where {s} is headquartered?",
    ("works_for", "founded_by", "born_in", "located_in"):
        "In which country was the founder of the organization that {s} works for born?",
    ("founded_by", "born_in", "located_in", "capital"):
        "What is the capital of the country where the founder of {s} was born?",
    ("works_for", "headquartered_in", "located_in", "capital"):
        "What is the capital of the country where the organization that {s} works for is "
        "headquartered?",
}
MAX_HOPS = max(len(path) for path in QUESTION_TEMPLATES)

# Distractor passages (SynthWorld v2): each mentions two entities and a relation's words without
# stating any fact, so a query for that relation of either entity can retrieve it instead of (or
# beside) the passage that answers: a search can be wasted. {a}, {b}: entity names.
_DISTRACTOR_SENTENCES = (
    "{a} once asked {b} where {b} was born, but the conversation moved on.",
    "A profile of {a} mentions {b} and the organization each works for, without naming it.",
    "{a} and {b} argued about which country is located nearest the sea.",
    "A rumour linked {a} to whoever founded {b}; nobody confirmed who founded it.",
    "{a} wrote a guide asking where organizations like {b} are headquartered.",
    "Travellers from {a} often ask what the capital of {b} is; the guidebook does not say.",
)


@dataclasses.dataclass(frozen=True)
class _RelationText:
  sentence: str  # the passage sentence stating the fact
  need: str      # what the agent still needs ("I need to find <need>.")
  fact: str      # the fact once read ("<fact>.")
  query: str     # the search query; its words besides the name occur in the subject's passage


_TEXT: dict[str, _RelationText] = {
    "born_in": _RelationText("{s} was born in {o}.", "where {s} was born", "{s} was born in {o}",
                             "where was {s} born"),
    "works_for": _RelationText("{s} works for {o}.", "which organization {s} works for",
                               "{s} works for {o}", "which organization does {s} work for"),
    "located_in": _RelationText("{s} is a city located in {o}.", "which country {s} is located in",
                                "{s} is located in {o}", "which country is {s} located in"),
    "capital": _RelationText("{s} is a country. The capital of {s} is {o}.",
                             "the capital of {s}", "the capital of {s} is {o}",
                             "what is the capital of {s}"),
    "founded_by": _RelationText("{s} was founded by {o}.", "who founded {s}",
                                "{s} was founded by {o}", "who founded {s}"),
    "headquartered_in": _RelationText("{s} is an organization headquartered in {o}.",
                                      "where {s} is headquartered", "{s} is headquartered in {o}",
                                      "where is {s} headquartered"),
}

# Order of the sentences in each type's passage (the type sentence comes first).
_PASSAGE_RELATIONS = {
    PERSON: ("born_in", "works_for"),
    CITY: ("located_in",),
    COUNTRY: ("capital",),
    ORGANIZATION: ("headquartered_in", "founded_by"),
}

# Share of each type in a world of n_entities (persons take the rest): ~8 cities per country,
# ~5 employees per organization.
_TYPE_FRACTIONS = {COUNTRY: 0.025, CITY: 0.2, ORGANIZATION: 0.125}

# Syllables: onset + vowel (+ coda on a word's last syllable only, which keeps consonant clusters
# between syllables out and the names pronounceable).
_ONSETS = ("b", "br", "d", "dr", "f", "g", "gr", "h", "k", "kr", "l", "m", "n", "p", "r", "s",
           "sk", "t", "th", "tr", "v", "vr", "z", "zh")
_VOWELS = ("a", "e", "i", "o", "u", "ae", "ei", "ou", "y")
_CODAS = ("", "", "n", "r", "l", "s", "th", "rn", "nd", "sk", "x", "m")
_ORG_SUFFIXES = ("Industries", "Labs", "Systems", "Holdings", "Group", "Dynamics", "Works",
                 "Partners", "Robotics", "Analytics")
# Real names and words the syllable generator can spell (places, given names, English words);
# a generated word equal to one of these is redrawn. Lowercase.
_REAL_WORDS = frozenset("""
accra baku bern doha dubai hanoi kabul kyiv lima male malta nauru oslo paris perth quito rabat
riga rome roma sana sofia suva tokyo kenya mali peru chad cuba fiji iran iraq laos niger oman
togo tonga samoa benin gabon ghana nepal spain sudan syria tunis yemen zambia russia india china
japan korea egypt haiti italy texas dallas denver boston miami moscow madrid berlin london
manila dhaka delhi kano lagos mumbai sydney toronto panama nairobi kigali bamako dakar harare
havana lisbon prague vienna warsaw zagreb athens cairo seoul taipei
anna maria marie sara sarah laura linda lisa nina nora rosa rita tina vera dora dana mona luna
mila lena elena irina olga diana hana yuki mika kira tara zara maya daniel david peter paul john
mark luke adam noah liam levi eric omar ivan igor boris yuri karl hans otto kofi juan jose luis
carlos pedro marco mario rosalind
born city country capital located founded works work labs group organization headquartered
bread brand bring broad drama dream drink drive frame frost grand grant great green grind
tribe trim trip truth brother father mother sister river dinner summer winter water paper
""".split())


@dataclasses.dataclass(frozen=True)
class Entity:
  """One entity: `id` is its corpus document id, `name` its (unique) title."""
  id: str
  name: str
  type: str


class SynthWorld:
  """A generated world: entities, functional relations, and questions per split.

  Attributes:
    seed: the generation seed.
    entities: list of Entity; an entity's index in this list is its integer handle.
    relations: relation name -> {subject index: object index}, one entry per subject of the
      relation's subject type (see RELATIONS).
    questions: split name ("train", "dev", "test") -> list of question records
      {"id", "question", "golden_answers": [answer name], "hops": int, "chain": [names from the
      subject to the answer, hops + 1 of them], "relations": [relation names, hops of them]}.
  """

  def __init__(self, seed: int, entities: list[Entity], relations: dict[str, dict[int, int]],
               questions: dict[str, list[dict[str, Any]]]):
    self.seed = seed
    self.entities = entities
    self.relations = relations
    self.questions = questions
    self.distractors: list[dict[str, str]] = []  # v2: extra corpus rows {"id", "contents"}
    self._by_name = {e.name: i for i, e in enumerate(entities)}

  # ---------------------------------------------------------------- generation

  @classmethod
  def generate(cls, seed: int = 0, n_entities: int = 2000, n_train: int = 4000, n_dev: int = 500,
               n_test: int = 500, hop_weights: Sequence[float] = (1.0, 1.0, 1.0),
               distractors: float = 0.0, confusable_rate: float = 0.0) -> SynthWorld:
    """Draws a world and its questions from `seed`.

    Args:
      seed: any int; the same arguments always give the same world.
      n_entities: total entities (>= 40): 2.5% countries, 20% cities, 12.5% organizations, the
        rest persons.
      n_train, n_dev, n_test: questions per split (0 leaves a split empty). Subject entities are
        partitioned across splits in proportion to these sizes.
      hop_weights: relative share of 1-, 2-, 3- (and with a fourth number 4-) hop questions in
        every split.
      distractors: distractor passages per entity (SynthWorld v2; 0: none). Each mentions two
        entities and a relation's words without stating a fact (`_DISTRACTOR_SENTENCES`), so a
        search for that relation can return it instead of the passage that answers.
      confusable_rate: share of persons whose family name is another person's (v2: "Brakor
        Zelnith" and "Tromi Zelnith"), so a name query can retrieve the wrong person.
      Both are drawn from their own random streams after everything else: with 0 and 0 (and 3
      hop weights) a seed gives exactly the world it gave before they existed.

    Raises:
      ValueError: sizes that the world cannot satisfy (too few distinct questions for a split's
        subjects); the message says which split and hop count ran short.
    """
    if n_entities < 40:
      raise ValueError(f"n_entities must be >= 40, got {n_entities}")
    sizes = {"train": n_train, "dev": n_dev, "test": n_test}
    if any(n < 0 for n in sizes.values()) or sum(sizes.values()) == 0:
      raise ValueError(f"question counts must be >= 0 and not all 0, got {sizes}")
    if len(hop_weights) not in (3, MAX_HOPS) or any(w < 0 for w in hop_weights) \
        or sum(hop_weights) <= 0:
      raise ValueError(f"hop_weights must be 3 or {MAX_HOPS} non-negative numbers, got "
                       f"{tuple(hop_weights)}")
    if distractors < 0 or not 0.0 <= confusable_rate <= 1.0:
      raise ValueError(f"distractors must be >= 0 and confusable_rate in [0, 1], got "
                       f"{distractors}, {confusable_rate}")
    rng = random.Random(seed)

    counts = {t: max(2, round(n_entities * f)) for t, f in _TYPE_FRACTIONS.items()}
    counts[CITY] = max(counts[CITY], counts[COUNTRY])  # every country needs a city
    counts[PERSON] = n_entities - sum(counts.values())
    names = _NameMaker(rng)
    entities: list[Entity] = []
    by_type: dict[str, list[int]] = {}
    for etype in ENTITY_TYPES:
      by_type[etype] = []
      for k in range(counts[etype]):
        by_type[etype].append(len(entities))
        entities.append(Entity(f"{etype}-{k:05d}", names.make(etype), etype))
    if confusable_rate:
      entities = _confusable_names(entities, by_type[PERSON], confusable_rate,
                                   random.Random(f"{seed}:confusable"))

    countries, cities = by_type[COUNTRY], by_type[CITY]
    persons, orgs = by_type[PERSON], by_type[ORGANIZATION]
    # Every country gets at least one city (round-robin over a shuffled order), the rest at
    # random; its capital is one of its own cities, so capital(k) is located_in k by design.
    shuffled = cities[:]
    rng.shuffle(shuffled)
    located_in = {c: countries[i] for i, c in enumerate(shuffled[:len(countries)])}
    for c in shuffled[len(countries):]:
      located_in[c] = rng.choice(countries)
    members: dict[int, list[int]] = {k: [] for k in countries}
    for c in cities:
      members[located_in[c]].append(c)
    relations = {
        "born_in": {p: rng.choice(cities) for p in persons},
        "works_for": {p: rng.choice(orgs) for p in persons},
        "located_in": {c: located_in[c] for c in cities},
        "capital": {k: rng.choice(members[k]) for k in countries},
        "founded_by": {o: rng.choice(persons) for o in orgs},
        "headquartered_in": {o: rng.choice(cities) for o in orgs},
    }
    world = cls(seed, entities, relations, {})
    world.questions = world._make_questions(rng, by_type, sizes, hop_weights)
    if distractors:
      world.distractors = _distractor_passages(entities, distractors,
                                               random.Random(f"{seed}:distractors"))
    return world

  def _make_questions(self, rng: random.Random, by_type: dict[str, list[int]],
                      sizes: dict[str, int], hop_weights: Sequence[float]
                      ) -> dict[str, list[dict[str, Any]]]:
    """Partitions subjects per type across splits, then samples (subject, path) per hop count."""
    total = sum(sizes.values())
    pools: dict[str, list[int]] = {s: [] for s in sizes}
    for etype in ENTITY_TYPES:
      subjects = by_type[etype][:]
      rng.shuffle(subjects)
      start = 0
      for i, (split, n) in enumerate(sizes.items()):
        # The last split takes the remainder so that every subject lands somewhere.
        end = len(subjects) if i == len(sizes) - 1 else start + round(len(subjects) * n / total)
        pools[split] += subjects[start:end]
        start = end
    out = {}
    for split, n in sizes.items():
      by_hops: dict[int, list[tuple[int, tuple[str, ...]]]] = {
          h: [] for h in range(1, MAX_HOPS + 1)}
      for s in pools[split]:
        for path in QUESTION_TEMPLATES:
          if RELATIONS[path[0]][0] == self.entities[s].type and self._chain(s, path) is not None:
            by_hops[len(path)].append((s, path))
      picked = []
      for hops, k in zip(range(1, len(hop_weights) + 1), _allocate(n, hop_weights)):
        if k > len(by_hops[hops]):
          raise ValueError(
              f"split {split!r} needs {k} {hops}-hop questions but its subjects allow only "
              f"{len(by_hops[hops])}; use more entities or fewer questions")
        picked += rng.sample(by_hops[hops], k)
      rng.shuffle(picked)
      out[split] = [self._question(f"{split}_{i}", s, path) for i, (s, path) in enumerate(picked)]
    return out

  def _chain(self, subject: int, path: Sequence[str]) -> list[int] | None:
    """Entities visited from `subject` along `path` (subject first), or None if one repeats."""
    chain = [subject]
    for rel in path:
      chain.append(self.relations[rel][chain[-1]])
    return chain if len(set(chain)) == len(chain) else None

  def _question(self, qid: str, subject: int, path: tuple[str, ...]) -> dict[str, Any]:
    chain = [self.entities[i].name for i in self._chain(subject, path)]
    return {"id": qid, "question": QUESTION_TEMPLATES[path].format(s=chain[0]),
            "golden_answers": [chain[-1]], "hops": len(path), "chain": chain,
            "relations": list(path)}

  # ---------------------------------------------------------------- corpus

  def passage(self, index: int) -> str:
    """Body text of entity `index`'s passage: one sentence per outgoing relation."""
    e = self.entities[index]
    objects = [self.entities[self.relations[rel][index]].name for rel in _PASSAGE_RELATIONS[e.type]]
    return " ".join(_TEXT[rel].sentence.format(s=e.name, o=o)
                    for rel, o in zip(_PASSAGE_RELATIONS[e.type], objects))

  def corpus(self) -> list[dict[str, str]]:
    """FlashRAG corpus rows, one per entity: {"id": entity id, "contents": '"Name"\\nbody'},
    then the distractor passages (v2)."""
    return [{"id": e.id, "contents": f'"{e.name}"\n{self.passage(i)}'}
            for i, e in enumerate(self.entities)] + self.distractors

  def entity(self, name: str) -> Entity:
    """The entity called `name` (names are unique). Raises KeyError."""
    return self.entities[self._by_name[name]]

  # ---------------------------------------------------------------- demonstrations

  @staticmethod
  def hop_query(relation: str, subject_name: str) -> str:
    """The search query of one hop: a question built from the subject name and relation words."""
    return _TEXT[relation].query.format(s=subject_name)

  def demonstrations(self, backend: SearchBackend, topk: int = 3, split: str = "train",
                     protocol: Protocol = SEARCH_R1, first_query: str = "hop",
                     stop_early_rate: float = 0.0) -> list[dict[str, Any]]:
    """One demonstration per question of `split`, with observations from real `backend` results.

    Hop i of a question searches `hop_query(relation_i, chain[i])` (with first_query="question",
    hop 0 searches the question text itself, as Search-R1 agents often do first: a small model
    then copies the question instead of having to extract its subject); the hop is accepted only when
    the subject's own passage (which states the fact) is among the top-`topk` documents. A miss
    retries with the bare subject name; if that misses too, RuntimeError (the world's passages
    or queries need fixing: a demo must never show an answer the documents do not support).

    stop_early_rate: the share of multi-hop demonstrations written by a hasty teacher that stops
    after k < hops searches (k uniform over 1..hops-1) and answers the entity it has reached
    (chain[k], a bridge, not the answer): the shortcut real cold-start models take. Which
    demonstrations stop is drawn from (seed, split), so it is reproducible. SFT on such data gives
    a policy that often answers a multi-hop question too early; RL has to learn that the next
    search pays (what `make demo` shows). 1-hop demonstrations are always complete.

    Returns records {"id", "question", "golden_answers", "hops", "protocol": protocol.name,
    "segments": [{"role": "assistant" | "observation", "text": str}, ...]}: assistant and
    observation segments alternate, starting and ending with an assistant segment; concatenated
    they are the trajectory text after the prompt (`protocol.prompt(question)`). Each assistant
    segment is `<think>...</think>\\n` plus one action and ends with the protocol's stop string;
    an observation segment is prefix + format_documents(docs) + suffix, as the rollout renders it.
    "searches" is the number of searches shown (hops unless the teacher stopped early) and
    "answer" the answer given (the gold one unless it stopped early).
    """
    if not 0.0 <= stop_early_rate <= 1.0:
      raise ValueError(f"stop_early_rate must be in [0, 1], got {stop_early_rate}")
    questions = self.questions[split]
    hops = [(qi, h) for qi, q in enumerate(questions) for h in range(q["hops"])]
    if first_query not in ("hop", "question"):
      raise ValueError(f"first_query must be 'hop' or 'question', got {first_query!r}")
    queries = [questions[qi]["question"] if (h == 0 and first_query == "question") else
               self.hop_query(questions[qi]["relations"][h], questions[qi]["chain"][h])
               for qi, h in hops]
    docs = self._search(backend, queries, topk)
    misses = [j for j, (qi, h) in enumerate(hops) if not self._supports(docs[j], questions[qi], h)]
    if misses:  # fallback: the bare name, whose own passage repeats it most
      retry = self._search(backend, [questions[hops[j][0]]["chain"][hops[j][1]] for j in misses],
                           topk)
      for j, d in zip(misses, retry):
        qi, h = hops[j]
        if not self._supports(d, questions[qi], h):
          raise RuntimeError(f"BM25 does not retrieve the passage of {questions[qi]['chain'][h]!r} "
                             f"for {questions[qi]['id']} hop {h + 1} (query {queries[j]!r})")
        queries[j], docs[j] = questions[qi]["chain"][h], d
    rng = random.Random(f"{self.seed}:stop_early:{split}")  # str seeds are stable across runs
    out, j = [], 0
    for q in questions:
      n = q["hops"]
      searches = n
      if n > 1 and rng.random() < stop_early_rate:
        searches = rng.randint(1, n - 1)
      out.append(_demo(q, queries[j:j + searches], docs[j:j + searches], protocol,
                       restate=first_query == "question"))
      j += n
    return out

  def hop_retrieval(self, backend: SearchBackend, topk: int, split: str = "train"
                    ) -> dict[str, float]:
    """How the teacher's hop queries fare against `backend` (what distractors and confusable
    names do to search): over every hop of `split`'s questions, the share whose needed passage
    (the hop subject's) ranks first, is missing from the top `topk`, and whose top `topk` holds
    a distractor passage; "queries" counts them."""
    questions = self.questions[split]
    hops = [(q, h) for q in questions for h in range(q["hops"])]
    docs = self._search(backend, [self.hop_query(q["relations"][h], q["chain"][h])
                                  for q, h in hops], topk)
    first = missing = distracted = 0
    for (q, h), d in zip(hops, docs):
      want = self.entity(q["chain"][h]).id
      first += bool(d) and d[0].id == want
      missing += not self._supports(d, q, h)
      distracted += any(x.id.startswith("distractor-") for x in d)
    n = max(len(hops), 1)
    return {"queries": float(len(hops)), "first": first / n, "missing": missing / n,
            "distractor_in_topk": distracted / n}

  @staticmethod
  def _search(backend: SearchBackend, queries: list[str], topk: int) -> list[list[Document]]:
    response = backend.search(queries, topk)
    for q, err in zip(queries, response.errors):
      if err is not None:
        raise RuntimeError(f"search failed for {q!r}: {err}")
    return response.documents

  def _supports(self, docs: Sequence[Document], question: dict[str, Any], hop: int) -> bool:
    """Whether `docs` hold the passage of the hop's subject (the one stating the hop's fact)."""
    subject_id = self.entity(question["chain"][hop]).id
    return any(d.id == subject_id for d in docs)

  # ---------------------------------------------------------------- files

  def write(self, out_dir: str, topk: int = 3, index_dir: str | None = None,
            protocol: Protocol = SEARCH_R1, backend: SearchBackend | None = None,
            first_query: str = "hop", stop_early_rate: float = 0.0) -> dict[str, str]:
    """Writes the world as FlashRAG-style files; returns {"corpus", "train", ..., "demos", ...}.

    Files in `out_dir` (created if needed):
      corpus.jsonl     one {"id", "contents"} passage per entity (the BM25 corpus)
      train.jsonl, dev.jsonl, test.jsonl   questions ({"id", "question", "golden_answers",
                       "hops", "chain", "relations"}); a split with no questions is not written
      demos.jsonl      one demonstration per training question (see `demonstrations`)
      entities.jsonl   {"id", "name", "type", "relations": {relation: object entity id}}
      world.json       {"seed", "num_entities", "topk", "protocol", "first_query",
                       "stop_early_rate", "splits": {split: size}}

    Demonstrations need search results: `backend` if given (it must serve this corpus), else a
    BM25Backend over the written corpus.jsonl with its index cached under `index_dir` (default:
    the BM25 cache folder, see agentjax.retrieval.bm25.default_index_dir).
    """
    os.makedirs(out_dir, exist_ok=True)
    paths = {"corpus": os.path.join(out_dir, "corpus.jsonl")}
    _write_jsonl(paths["corpus"], self.corpus())
    for split, rows in self.questions.items():
      if rows:
        paths[split] = os.path.join(out_dir, f"{split}.jsonl")
        _write_jsonl(paths[split], rows)
    paths["entities"] = os.path.join(out_dir, "entities.jsonl")
    _write_jsonl(paths["entities"], [
        {"id": e.id, "name": e.name, "type": e.type,
         "relations": {rel: self.entities[self.relations[rel][i]].id
                       for rel in _PASSAGE_RELATIONS[e.type]}}
        for i, e in enumerate(self.entities)])
    if self.questions.get("train"):
      if backend is None:
        from agentjax.retrieval.bm25 import BM25Backend  # bm25s only when needed
        backend = BM25Backend(paths["corpus"], index_dir=index_dir)
      paths["demos"] = os.path.join(out_dir, "demos.jsonl")
      _write_jsonl(paths["demos"], self.demonstrations(backend, topk, "train", protocol,
                                                       first_query, stop_early_rate))
    paths["world"] = os.path.join(out_dir, "world.json")
    with open(paths["world"], "w") as f:
      json.dump({"seed": self.seed, "num_entities": len(self.entities),
                 "distractor_passages": len(self.distractors), "topk": topk,
                 "protocol": protocol.name, "first_query": first_query,
                 "stop_early_rate": stop_early_rate,
                 "splits": {s: len(rows) for s, rows in self.questions.items()}}, f, indent=2)
    return paths


class _NameMaker:
  """Unique invented names. Every name word is unique across the world (lowercased), so a
  name's words point BM25 at few passages; org suffixes ("Labs") are the only shared words."""

  def __init__(self, rng: random.Random):
    self._rng = rng
    self._used: set[str] = set()  # membership only; never iterated (iteration order is salted)

  def _word(self, min_syllables: int, max_syllables: int) -> str:
    rng = self._rng
    while True:
      n = rng.randint(min_syllables, max_syllables)
      word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(n))
      word += rng.choice(_CODAS)
      if len(word) >= 4 and word not in _REAL_WORDS and word not in self._used:
        self._used.add(word)
        return word.capitalize()

  def make(self, etype: str) -> str:
    if etype == PERSON:
      return f"{self._word(2, 2)} {self._word(2, 3)}"
    if etype == ORGANIZATION:
      return f"{self._word(2, 3)} {self._rng.choice(_ORG_SUFFIXES)}"
    return self._word(2, 3)


def _confusable_names(entities: list[Entity], persons: Sequence[int], rate: float,
                      rng: random.Random) -> list[Entity]:
  """A `rate` share of `persons` take the family name of another person (full names stay
  unique): pairs of confusable names, which a name query cannot tell apart by that word."""
  out = list(entities)
  taken = {e.name for e in entities}  # membership only
  for p in persons:
    if rng.random() >= rate:
      continue
    donor = out[rng.choice(persons)]
    first = out[p].name.split(" ")[0]
    name = f"{first} {donor.name.split(' ')[-1]}"
    if donor.id != out[p].id and name not in taken:
      taken.add(name)
      out[p] = dataclasses.replace(out[p], name=name)
  return out


def _distractor_passages(entities: Sequence[Entity], per_entity: float,
                         rng: random.Random) -> list[dict[str, str]]:
  """round(per_entity * entities) corpus rows, each naming two entities in its title and in one
  `_DISTRACTOR_SENTENCES` sentence that states no fact."""
  rows = []
  for i in range(round(per_entity * len(entities))):
    a, b = rng.sample(range(len(entities)), 2)
    na, nb = entities[a].name, entities[b].name
    sentence = rng.choice(_DISTRACTOR_SENTENCES).format(a=na, b=nb)
    rows.append({"id": f"distractor-{i:05d}", "contents": f'"{na} and {nb}"\n{sentence}'})
  return rows


def _allocate(n: int, weights: Sequence[float]) -> list[int]:
  """Splits n into integer parts proportional to weights (largest remainder, ties to the first)."""
  total = float(sum(weights))
  exact = [n * w / total for w in weights]
  parts = [int(x) for x in exact]
  order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - parts[i]), i))
  for i in order[:n - sum(parts)]:
    parts[i] += 1
  return parts


def _action(protocol: Protocol, kind: str, content: str) -> str:
  """The action text of one assistant turn, ending with the protocol's stop string."""
  if kind == "answer":
    return f"<answer> {content} </answer>"
  if protocol.name == "search_r1":
    return f"<search> {content} </search>"
  call = json.dumps({"name": "search", "arguments": {"query": content}}, ensure_ascii=False)
  return f"<tool_call>\n{call}\n</tool_call>"


def _sentence(text: str) -> str:
  return text[:1].upper() + text[1:]


def _demo(question: dict[str, Any], queries: Sequence[str], docs: Sequence[Sequence[Document]],
          protocol: Protocol, restate: bool = False) -> dict[str, Any]:
  """A demonstration record (see SynthWorld.demonstrations) from the query and documents of each
  hop it searches; with fewer than `hops` of them, it answers the entity the last one reached."""
  chain, rels = question["chain"], question["relations"]
  if not 1 <= len(queries) <= len(rels):
    raise ValueError(f"{question['id']}: a demonstration searches 1..{len(rels)} hops, "
                     f"got {len(queries)}")
  segments = []
  for h, (rel, query) in enumerate(zip(rels, queries)):
    need = _TEXT[rel].need.format(s=chain[h])
    if h == 0 and restate and query == question["question"]:
      think = "I will search for the question."
    elif h == 0:
      think = f"I need to find {need}."
    else:
      known = _TEXT[rels[h - 1]].fact.format(s=chain[h - 1], o=chain[h])
      think = f"{_sentence(known)}. Now I need to find {need}."
    segments.append({"role": "assistant",
                     "text": f"<think>{think}</think>\n{_action(protocol, 'search', query)}"})
    segments.append({"role": "observation", "text": "".join(protocol.observation(docs[h]))})
  k = len(queries)
  answer = chain[k]  # the gold answer when every hop was searched
  think = f"{_sentence(_TEXT[rels[k - 1]].fact.format(s=chain[k - 1], o=answer))}. " \
          f"So the answer is {answer}."
  segments.append({"role": "assistant",
                   "text": f"<think>{think}</think>\n{_action(protocol, 'answer', answer)}"})
  return {"id": question["id"], "question": question["question"],
          "golden_answers": question["golden_answers"], "hops": question["hops"],
          "protocol": protocol.name, "segments": segments, "searches": k, "answer": answer}


def _write_jsonl(path: str, rows: Sequence[dict[str, Any]]) -> None:
  # Write then rename: a reader (or a tfds build) never sees a half-written file.
  tmp = f"{path}.tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    for row in rows:
      f.write(json.dumps(row, ensure_ascii=False) + "\n")
  os.replace(tmp, path)
