"""The import graph of agentjax: no cycle between its modules, and no arrow running up the layers.

Edges are read from the source (ast), so an import inside a function counts as much as one at the
top of a module: a cycle hidden by a deferred import is still a cycle. `from agentjax.a import b`
is an edge to the module agentjax.a.b when b is a module, else to agentjax.a (its __init__).
"""

from __future__ import annotations

import ast
import pathlib

import agentjax

ROOT = pathlib.Path(agentjax.__file__).parent

# Lower layers never import the upper ones: models, sampling, the agent, retrieval, judges and the
# RL math know nothing of methods, trainers, DAC, Co-ReAct, studies, benchmarks or serving.
LOWER = ("agentjax.models", "agentjax.sampling", "agentjax.agent", "agentjax.retrieval",
         "agentjax.judge", "agentjax.rl", "agentjax.parallel", "agentjax.data")
UPPER = ("agentjax.methods", "agentjax.signals", "agentjax.train", "agentjax.dac",
         "agentjax.coreact", "agentjax.studies", "agentjax.benchmarks", "agentjax.serve")


def _modules() -> dict[str, pathlib.Path]:
  out = {}
  for path in sorted(ROOT.rglob("*.py")):
    name = ".".join(("agentjax",) + path.relative_to(ROOT).with_suffix("").parts)
    out[name.removesuffix(".__init__")] = path
  return out


def import_graph(modules: dict[str, pathlib.Path]) -> dict[str, set[str]]:
  """{module: the agentjax modules it imports anywhere in its source}."""
  graph = {}
  for module, path in modules.items():
    deps = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      if isinstance(node, ast.Import):
        deps |= {a.name for a in node.names}
      elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        for a in node.names:
          sub = f"{node.module}.{a.name}"
          deps.add(sub if sub in modules else node.module)
      elif isinstance(node, ast.ImportFrom) and node.level:  # relative: resolve against module
        base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        base = base[:len(base) - node.level + 1]
        pkg = ".".join(base + ([node.module] if node.module else []))
        for a in node.names:
          sub = f"{pkg}.{a.name}"
          deps.add(sub if sub in modules else pkg)
    graph[module] = {d for d in deps if d in modules and d != module}
  return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one module (Tarjan), each sorted."""
  index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

  def connect(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in sorted(graph[v]):
      if w not in index:
        connect(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        out.append(sorted(comp))

  for v in sorted(graph):
    if v not in index:
      connect(v)
  return out


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import(tmp_path):
  """The check itself: a two-module cycle whose back edge is a deferred import is reported, and
  a relative import resolves."""
  (tmp_path / "a.py").write_text("from agentjax.b import f\n")
  (tmp_path / "b.py").write_text("def f():\n  from agentjax import c\n")
  (tmp_path / "c.py").write_text("def g():\n  from .a import x\n")
  (tmp_path / "d.py").write_text("import agentjax.a\n")
  modules = {f"agentjax.{n}": tmp_path / f"{n}.py" for n in "abcd"}
  graph = import_graph(modules)
  assert graph["agentjax.b"] == {"agentjax.c"} and graph["agentjax.c"] == {"agentjax.a"}
  assert cycles(graph) == [["agentjax.a", "agentjax.b", "agentjax.c"]]
  (tmp_path / "c.py").write_text("def g():\n  pass\n")
  assert cycles(import_graph(modules)) == []


def test_no_import_cycle_between_agentjax_modules():
  found = cycles(import_graph(_modules()))
  assert not found, f"import cycles (counting imports inside functions): {found}"


def test_no_lower_layer_imports_an_upper_one():
  graph = import_graph(_modules())
  up = sorted((m, d) for m, deps in graph.items() if m.startswith(LOWER)
              for d in deps if d.startswith(UPPER))
  assert not up, f"arrows running up the layers: {up}"
