"""The package's import structure: no module of seed_jax on an import cycle (imports inside functions count:
they run too, only later), no module over 450 lines, and the update loop (seed_jax.pipeline) imported only
by the training loop and the experiment runner (and benchmarks, outside the package)."""
from __future__ import annotations

import ast
import os

import pytest

PACKAGE = "seed_jax"
ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), PACKAGE)
MAX_LINES = 450
UPDATE_LOOP = "seed_jax.pipeline"
UPDATE_LOOP_IMPORTERS = {"seed_jax.loop", "seed_jax.experiment", "seed_jax.paired"}  # paired: its phases, per arm


def _modules() -> dict[str, str]:
  """Dotted module name -> file, for every .py file of the package (a package is its __init__)."""
  out = {}
  for folder, _, files in os.walk(ROOT):
    for f in sorted(files):
      if f.endswith(".py"):
        rel = os.path.relpath(os.path.join(folder, f), os.path.dirname(ROOT))[:-3].split(os.sep)
        out[".".join(rel[:-1] if rel[-1] == "__init__" else rel)] = os.path.join(folder, f)
  return out


def _imports(name: str, path: str, modules: dict[str, str]) -> set[str]:
  """The package modules `name` imports anywhere in its file (module level, functions, branches)."""
  is_package = path.endswith("__init__.py")
  out = set()
  for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
    if isinstance(node, ast.Import):
      out.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom):
      if node.level:  # relative: from the module's own package, up level - 1 more
        parts = name.split(".") if is_package else name.split(".")[:-1]
        parts = parts[:len(parts) - (node.level - 1)]
        base = ".".join(parts + ([node.module] if node.module else []))
      else:
        base = node.module or ""
      for a in node.names:  # `from pkg import mod` imports the submodule; `from mod import name` the module
        out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base)
  return {m for m in out if m in modules and m != name}


def _graph() -> dict[str, set[str]]:
  modules = _modules()
  return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one module (Tarjan), each sorted."""
  index, low, on_stack, stack, out = {}, {}, set(), [], []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(graph[v]):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        out.append(sorted(comp))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return sorted(out)


def _a_cycle(graph: dict[str, set[str]], comp: list[str]) -> list[str]:
  """One import path around a component, for the message: a -> b -> ... -> a."""
  members, start = set(comp), comp[0]
  paths, seen = [[start]], {start}
  while paths:
    path = paths.pop(0)
    for w in sorted(graph[path[-1]] & members):
      if w == start:
        return path + [start]
      if w not in seen:
        seen.add(w)
        paths.append(path + [w])
  return comp


def test_cycle_finder_sees_function_level_and_relative_imports(tmp_path):
  graph = {"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}, "p.d": {"p.a"}}
  assert _cycles(graph) == [["p.a", "p.b", "p.c"]]
  assert _a_cycle(graph, ["p.a", "p.b", "p.c"]) == ["p.a", "p.b", "p.c", "p.a"]
  (tmp_path / "m.py").write_text("def f():\n  from . import n\n  from .sub import k\n")
  modules = {"p.m": "", "p.n": "", "p.sub": "", "p.sub.k": ""}
  assert _imports("p.m", str(tmp_path / "m.py"), modules) == {"p.n", "p.sub.k"}


def test_no_import_cycle():
  graph = _graph()
  cycles = _cycles(graph)
  assert not cycles, "import cycles in seed_jax:\n" + "\n".join(
      f"{', '.join(c)} (e.g. {' -> '.join(_a_cycle(graph, c))})" for c in cycles)


@pytest.mark.parametrize("name", sorted(_modules()))
def test_module_size(name):
  with open(_modules()[name], encoding="utf-8") as f:
    n = sum(1 for _ in f)
  assert n <= MAX_LINES, f"{name} has {n} lines (at most {MAX_LINES})"


def test_only_the_loop_and_the_experiments_import_the_update_loop():
  importers = {m for m, deps in _graph().items() if UPDATE_LOOP in deps}
  assert importers <= UPDATE_LOOP_IMPORTERS, f"{UPDATE_LOOP} imported by {sorted(importers - UPDATE_LOOP_IMPORTERS)}"
