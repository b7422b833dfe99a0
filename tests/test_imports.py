"""The import graph of jaxfid/ and tasks/: layered, acyclic, imports at top.

Every module under ``jaxfid/`` and ``tasks/`` is parsed (never imported) and
every import statement in it, at module level or inside a function, becomes
an edge to the jaxfid/tasks module it names (``from pkg import name`` is an
edge to ``pkg.name`` when that is a module, else to ``pkg``). Three rules:

* no cycle among modules;
* no import from a lower layer of :data:`LAYERS` to a higher one;
* imports at module top: a function-level import is allowed only for a heavy
  optional stack (:data:`HEAVY_STACKS`), and only in ``jaxfid/commands/``;
  nothing else under ``jaxfid/`` imports a heavy stack (``tasks/`` imports
  them at its top); the serve extra (:data:`SERVE_STACK`) only inside
  functions of a method's commands (``jaxfid/<method>/commands``).
"""
from __future__ import annotations

import ast
import dataclasses
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("jaxfid", "tasks")

# Highest first. A module may import modules of its own group and of any
# group on a lower row; groups on one row (split by "|") never import each
# other. A group is one or more names (a module or package, with everything
# under it; "jaxfid" alone is the package's __init__; "*" stands for any one
# package, so "jaxfid.*.plugin" is every method's plug-in module). A
# method's plug-in module and its commands are its face on the command
# line: they sit above the shared commands they use, inside the method's
# package. A method package the table does not name (a new method: a
# package with a plugin.py) sits on NEW_METHODS' row, a group of its own.
NEW_METHODS = "jaxfid.reatt"
LAYERS = (
    "jaxfid  jaxfid.__main__  jaxfid.cli  jaxfid.methods",
    "jaxfid.*.plugin  jaxfid.*.commands",
    "jaxfid.aot",
    "jaxfid.commands",
    "tasks",
    "jaxfid.reatt  |  jaxfid.refusion  |  jaxfid.distill  |  jaxfid.serving",
    "jaxfid.fid",
    "jaxfid.reader",
    "jaxfid.dual_encoder",
    "jaxfid.training",
    "jaxfid.retrieval",
    "jaxfid.checkpoints  |  jaxfid.evaluation",
    "jaxfid.t5",
    "jaxfid.runtime",
    "jaxfid.core",
)

# Imported inside functions, and only by jaxfid/commands/: nothing else
# under jaxfid/ may pull them in. The serve extra's web stack (uvicorn,
# Starlette) is optional too: imported inside the functions of a method's
# commands (`jaxfid serve`, jaxfid/fid/commands/), so that the command line
# starts without it.
HEAVY_STACKS = ("tensorflow", "tensorflow_text", "tensorflow_datasets",
                "seqio", "tasks", "torch", "transformers")
SERVE_STACK = ("uvicorn", "starlette")
FUNCTION_IMPORTS_ALLOWED_IN = ("jaxfid.commands",)
SERVE_IMPORTS_ALLOWED_IN = ("jaxfid.*.commands",)


@dataclasses.dataclass(frozen=True)
class Import:
  importer: str     # module name
  target: str       # full name as written (a module, or a third-party name)
  path: str         # file, relative to ROOT
  line: int
  in_function: bool


def _module_files() -> dict[str, str]:
  """Module name -> file path (relative to ROOT) of every module."""
  out = {}
  for package in PACKAGES:
    for directory, _, files in os.walk(os.path.join(ROOT, package)):
      for name in sorted(files):
        if not name.endswith(".py"):
          continue
        rel = os.path.relpath(os.path.join(directory, name), ROOT)
        parts = rel[:-len(".py")].split(os.sep)
        if parts[-1] == "__init__":
          parts = parts[:-1]
        out[".".join(parts)] = rel
  return out


class _Collector(ast.NodeVisitor):
  """All import statements of one module, marked module- or function-level."""

  def __init__(self, module: str, path: str, is_package: bool,
               modules: set[str]):
    self.module = module
    self.path = path
    self.package = module if is_package else module.rpartition(".")[0]
    self.modules = modules
    self.depth = 0
    self.found: list[Import] = []

  def _function(self, node):
    self.depth += 1
    self.generic_visit(node)
    self.depth -= 1

  visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

  def _add(self, target: str, node: ast.stmt) -> None:
    self.found.append(Import(self.module, target, self.path, node.lineno,
                             self.depth > 0))

  def visit_Import(self, node: ast.Import) -> None:
    for alias in node.names:
      self._add(alias.name, node)

  def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
    base = node.module or ""
    if node.level:
      parts = self.package.split(".")
      parts = parts[:len(parts) - (node.level - 1)]
      base = ".".join(parts + ([base] if base else []))
    for alias in node.names:
      sub = f"{base}.{alias.name}"
      self._add(sub if sub in self.modules else base, node)


def collect_imports() -> tuple[dict[str, str], list[Import]]:
  files = _module_files()
  modules = set(files)
  imports = []
  for module, path in sorted(files.items()):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
      tree = ast.parse(f.read(), filename=path)
    collector = _Collector(module, path, path.endswith("__init__.py"),
                           modules)
    collector.visit(tree)
    imports.extend(collector.found)
  return files, imports


def _internal(name: str, modules: set[str]) -> str | None:
  """The jaxfid/tasks module an import names (its longest module prefix)."""
  while name:
    if name in modules:
      return name
    name = name.rpartition(".")[0]
  return None


def _top_name(name: str) -> str:
  return name.split(".")[0]


def _within(module: str, prefix: str) -> bool:
  if prefix == "jaxfid":  # the package module itself, not all of jaxfid
    return module == "jaxfid"
  if "*" in prefix:  # one "*": any single package name there
    parts, pattern = module.split("."), prefix.split(".")
    return len(parts) >= len(pattern) and all(
        want in ("*", got) for want, got in zip(pattern, parts))
  return module == prefix or module.startswith(prefix + ".")


def layer_of(module: str) -> tuple[int, str]:
  """(row in LAYERS, group) of a module; KeyError if the table lacks it."""
  for row, groups in enumerate(LAYERS):
    for group in groups.split("|"):
      if any(_within(module, name) for name in group.split()):
        return row, group.split()[0]
  package = ".".join(module.split(".")[:2])
  if os.path.exists(os.path.join(ROOT, *package.split("."), "plugin.py")):
    return layer_of(NEW_METHODS)[0], package  # a method the table lacks
  raise KeyError(module)


def _edges(imports: list[Import], modules: set[str]
           ) -> dict[str, dict[str, Import]]:
  graph: dict[str, dict[str, Import]] = {m: {} for m in modules}
  for imp in imports:
    target = _internal(imp.target, modules)
    if target is not None and target != imp.importer:
      graph[imp.importer].setdefault(target, imp)
  return graph


def find_cycle(graph: dict[str, dict[str, Import]]) -> list[str] | None:
  """One cycle (a list of modules, first == last), or None."""
  state: dict[str, int] = {}  # 1: on the stack, 2: done
  stack: list[str] = []

  def visit(node: str) -> list[str] | None:
    state[node] = 1
    stack.append(node)
    for target in sorted(graph[node]):
      if state.get(target) == 1:
        return stack[stack.index(target):] + [target]
      if target not in state:
        cycle = visit(target)
        if cycle:
          return cycle
    stack.pop()
    state[node] = 2
    return None

  for node in sorted(graph):
    if node not in state:
      cycle = visit(node)
      if cycle:
        return cycle
  return None


def _where(imp: Import) -> str:
  return f"{imp.path}:{imp.line}"


def test_every_module_has_a_layer():
  files, _ = collect_imports()
  missing = []
  for module in files:
    try:
      layer_of(module)
    except KeyError:
      missing.append(module)
  assert not missing, f"modules missing from LAYERS: {missing}"
  names = [n for row in LAYERS for group in row.split("|")
           for n in group.split()]
  unused = [n for n in names if not any(_within(m, n) for m in files)]
  assert not unused, f"LAYERS names no module: {unused}"


def test_no_cycles():
  files, imports = collect_imports()
  graph = _edges(imports, set(files))
  cycle = find_cycle(graph)
  if cycle:
    steps = [f"{a} ({_where(graph[a][b])})" for a, b in zip(cycle, cycle[1:])]
    raise AssertionError("import cycle: " + " -> ".join(steps)
                         + f" -> {cycle[-1]}")


def layer_violations(modules: set[str], imports: list[Import]) -> list[str]:
  out = []
  for imp in imports:
    target = _internal(imp.target, modules)
    if target is None:
      continue
    row, group = layer_of(imp.importer)
    target_row, target_group = layer_of(target)
    if target_group == group or target_row > row:
      continue
    direction = "up" if target_row < row else "sideways"
    out.append(f"{_where(imp)}: {imp.importer} imports {target} "
               f"({direction}: {group} -> {target_group})")
  return out


def test_imports_only_go_down():
  files, imports = collect_imports()
  violations = layer_violations(set(files), imports)
  assert not violations, "\n".join(["imports against LAYERS:"] + violations)


def function_import_violations(modules: set[str],
                               imports: list[Import]) -> list[str]:
  out = []
  for imp in imports:
    heavy = _top_name(imp.target) in HEAVY_STACKS
    if _top_name(imp.target) in SERVE_STACK:
      if not (imp.in_function and any(
          _within(imp.importer, p) for p in SERVE_IMPORTS_ALLOWED_IN)):
        out.append(f"{_where(imp)}: {imp.target} (the serve extra) outside "
                   "a function of a method's commands")
      continue
    if not imp.in_function:
      if heavy and _within(imp.importer, "jaxfid.commands"):
        out.append(f"{_where(imp)}: {imp.target} at module top: import it "
                   "inside the command function that needs it")
      elif heavy and _top_name(imp.importer) == "jaxfid":
        out.append(f"{_where(imp)}: {imp.target} (a heavy stack) imported "
                   "outside jaxfid/commands/ and tasks/")
      continue
    internal = _internal(imp.target, modules)
    allowed_here = any(_within(imp.importer, p)
                       for p in FUNCTION_IMPORTS_ALLOWED_IN)
    if heavy and allowed_here:
      continue
    if internal is not None and not heavy:
      why = "a jaxfid module"
    elif heavy:
      why = "a heavy stack outside jaxfid/commands/"
    else:
      why = "not a heavy stack"
    out.append(f"{_where(imp)}: function-level import of {imp.target} "
               f"({why}): import it at module top")
  return out


def test_imports_at_module_top():
  files, imports = collect_imports()
  violations = function_import_violations(set(files), imports)
  assert not violations, "\n".join(["function-level imports:"] + violations)


# A method is a package with a plug-in module (``jaxfid/<method>/plugin.py``,
# which registers what the method offers). Outside the method packages only
# jaxfid.methods imports a method, and only its plug-in: the shared layers
# (the command line included) find what the methods offer in registries.
# ``tasks/`` (the seqio tasks of the methods' data) is not a shared layer.
# Left, with the reason, until it is gone (a stale entry fails):
METHOD_IMPORT_EXCEPTIONS: dict[str, str] = {}


def method_packages(modules) -> set[str]:
  """``jaxfid.<name>`` of every package with a ``plugin`` module."""
  return {m.rpartition(".")[0] for m in modules
          if m.startswith("jaxfid.") and m.count(".") == 2
          and m.endswith(".plugin")}


def method_import_violations(modules: set[str], imports: list[Import],
                             exceptions=()) -> list[str]:
  methods = method_packages(modules)

  def method_of(module):
    return next((m for m in methods if _within(module, m)), None)

  out = []
  for imp in imports:
    target = _internal(imp.target, modules)
    owner = target and method_of(target)
    if (not owner or _top_name(imp.importer) != "jaxfid"
        or method_of(imp.importer) or imp.importer in exceptions):
      continue
    if imp.importer == "jaxfid.methods" and target == f"{owner}.plugin":
      continue
    out.append(f"{_where(imp)}: {imp.importer} imports {target} (a method): "
               "register it from the method's plugin and look it up")
  return out


def test_shared_layers_import_no_method():
  files, imports = collect_imports()
  violations = method_import_violations(set(files), imports,
                                        METHOD_IMPORT_EXCEPTIONS)
  assert not violations, "\n".join(["method imports:"] + violations)
  methods = method_packages(files)
  stale = [m for m in METHOD_IMPORT_EXCEPTIONS
           if not any(i.importer == m and any(
               _within(_internal(i.target, set(files)) or "", p)
               for p in methods) for i in imports)]
  assert not stale, f"no longer import a method: {stale}"


def test_methods_imports_every_plugin():
  files, imports = collect_imports()
  plugins = {f"{m}.plugin" for m in method_packages(files)}
  assert plugins >= {"jaxfid.fid.plugin", "jaxfid.dual_encoder.plugin",
                     "jaxfid.reatt.plugin", "jaxfid.refusion.plugin"}
  imported = {_internal(i.target, set(files)) for i in imports
              if i.importer == "jaxfid.methods"}
  assert plugins <= imported, sorted(plugins - imported)


def test_the_checker_sees_what_it_should():
  """The rules catch a cycle, an upward import and a function-level import."""
  graph = {"a": {"b": None}, "b": {"c": None}, "c": {"a": None}, "d": {}}
  assert find_cycle(graph) == ["a", "b", "c", "a"]
  assert find_cycle({"a": {"b": None}, "b": {}}) is None
  assert layer_of("jaxfid.core.files") == (len(LAYERS) - 1, "jaxfid.core")
  assert layer_of("jaxfid.runtime.files") == (len(LAYERS) - 2, "jaxfid.runtime")
  assert layer_of("jaxfid") == layer_of("jaxfid.methods")
  assert layer_of("jaxfid.cli")[1] == layer_of("jaxfid.methods")[1]
  assert layer_of("jaxfid.reatt.plugin")[1] == "jaxfid.*.plugin"
  assert layer_of("jaxfid.fid.commands.demo")[1] == "jaxfid.*.plugin"
  assert layer_of("jaxfid.commands.index")[1] == "jaxfid.commands"
  assert layer_of("jaxfid.commands.x.commands")[1] == "jaxfid.commands"
  assert (layer_of("jaxfid.cli")[0] < layer_of("jaxfid.reatt.plugin")[0]
          < layer_of("jaxfid.commands.index")[0]
          < layer_of("jaxfid.reatt.model")[0])
  assert layer_of("jaxfid.reatt.model")[1] != layer_of("jaxfid.refusion")[1]
  source = ("from . import sibling\n"
            "def f():\n"
            "  from jaxfid.core import errors\n"
            "  import numpy\n")
  collector = _Collector("jaxfid.retrieval.x", "x.py", False,
                         {"jaxfid.retrieval.sibling", "jaxfid.core.errors"})
  collector.visit(ast.parse(source))
  assert [(i.target, i.in_function) for i in collector.found] == [
      ("jaxfid.retrieval.sibling", False), ("jaxfid.core.errors", True),
      ("numpy", True)]
  assert _internal("jaxfid.core.errors.InputError",
                   {"jaxfid.core.errors"}) == "jaxfid.core.errors"
  assert _internal("numpy", {"jaxfid.core.errors"}) is None
  modules = {"jaxfid.core.x", "jaxfid.t5.y", "jaxfid.reatt.r",
             "jaxfid.refusion.f", "jaxfid.commands.c"}

  def imp(importer, target, in_function=False):
    return Import(importer, target, "f.py", 7, in_function)
  assert layer_violations(modules, [
      imp("jaxfid.t5.y", "jaxfid.core.x"), imp("jaxfid.reatt.r", "numpy"),
      imp("jaxfid.commands.c", "jaxfid.refusion.f")]) == []
  assert layer_violations(modules, [
      imp("jaxfid.core.x", "jaxfid.t5.y"),
      imp("jaxfid.reatt.r", "jaxfid.refusion.f")]) == [
          "f.py:7: jaxfid.core.x imports jaxfid.t5.y (up: jaxfid.core -> "
          "jaxfid.t5)",
          "f.py:7: jaxfid.reatt.r imports jaxfid.refusion.f (sideways: "
          "jaxfid.reatt -> jaxfid.refusion)"]
  assert function_import_violations(modules, [
      imp("jaxfid.commands.c", "tensorflow", True),
      imp("jaxfid.commands.c", "tasks.qa", True),
      imp("tasks.qa", "seqio")]) == []
  found = function_import_violations(modules, [
      imp("jaxfid.t5.y", "jaxfid.core.x", True),
      imp("jaxfid.commands.c", "jaxfid.core.x", True),
      imp("jaxfid.core.x", "torch", True), imp("jaxfid.core.x", "json", True),
      imp("jaxfid.commands.c", "seqio"), imp("jaxfid.t5.y", "transformers")])
  assert [v.split(": ", 1)[1].split(" (")[0] for v in found] == [
      "function-level import of jaxfid.core.x",
      "function-level import of jaxfid.core.x",
      "function-level import of torch", "function-level import of json",
      "seqio at module top: import it inside the command function that "
      "needs it", "transformers"]
  # the serve stack: inside a function of a method's commands, nowhere else
  assert function_import_violations(modules, [
      imp("jaxfid.serving.commands.serve", "uvicorn", True),
      imp("jaxfid.reatt.commands", "starlette.routing", True)]) == []
  found = function_import_violations(modules, [
      imp("jaxfid.serving.commands.serve", "uvicorn"),
      imp("jaxfid.serving.app", "starlette", True),
      imp("jaxfid.commands.c", "starlette.routing", True)])
  assert len(found) == 3 and all("(the serve extra) outside" in v
                                 for v in found)
  methods = {"jaxfid.reatt.plugin", "jaxfid.reatt.model", "jaxfid.fid.plugin",
             "jaxfid.fid.task", "jaxfid.commands.c", "jaxfid.methods",
             "jaxfid.core.x", "tasks.qa"}
  assert method_packages(methods) == {"jaxfid.reatt", "jaxfid.fid"}
  assert method_import_violations(methods, [
      imp("jaxfid.methods", "jaxfid.reatt.plugin"),
      imp("jaxfid.reatt.model", "jaxfid.fid.task"),
      imp("tasks.qa", "jaxfid.fid.task"),
      imp("jaxfid.commands.c", "jaxfid.core.x")]) == []
  found = method_import_violations(methods, [
      imp("jaxfid.commands.c", "jaxfid.fid.task"),
      imp("jaxfid.methods", "jaxfid.reatt.model"),
      imp("jaxfid.core.x", "jaxfid.reatt.plugin")])
  assert [v.split(": ")[1] for v in found] == [
      "jaxfid.commands.c imports jaxfid.fid.task (a method)",
      "jaxfid.methods imports jaxfid.reatt.model (a method)",
      "jaxfid.core.x imports jaxfid.reatt.plugin (a method)"]
  assert method_import_violations(methods, [
      imp("jaxfid.commands.c", "jaxfid.fid.task")],
      {"jaxfid.commands.c": "why"}) == []
