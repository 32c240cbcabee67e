"""The package's import contract, read from the `ast` of every module (no import-linter).

Layers, top to bottom; a module may import only from its own unit or from a lower layer:

    cli (+ __main__)                               the commands
    testing                                        the golden-test kit (runs the run's loop)
    runtime                                        building and running a run
    api                                            what a method file imports, in one place
    config                                         composes and validates the config; checks
                                                   names against the registries of methods,
                                                   models, data and text (lazily), so it sits
                                                   above them and below runtime and cli (the
                                                   typed run config it builds, `RootConfig`,
                                                   is defined in core/run_config.py, so that
                                                   what reads it needs nothing above it)
    methods                                        one file per method
    server_steps | text | models | data | tracking independent of each other, except
                                                   server_steps -> text (FedTSP's prompt
                                                   tuning drives the frozen text encoder),
                                                   models -> text (the CLIP prompt learner)
    core                                           messages, state, bases, registries
    (the root `fl_lightning/__init__.py` imports nothing of the package)

A unit is a subpackage (`fl_lightning.data`) or a top-level module (`fl_lightning.config`).
Every import counts, also those inside functions and under `if TYPE_CHECKING:`, with no
exception.

Further rules:
* no import cycle between modules, counting imports inside functions too (only those under
  `if TYPE_CHECKING:` are left out). A package `__init__` importing its own submodules so that
  they register (`models`, `text`, `methods`, `data`) is loading, not a dependency, and is left
  out as well; a submodule taking its registry from its package is the only back edge this
  allows, and the fresh-interpreter test below proves it works whichever module comes first;
* `core/` and `methods/` never import `ray` or `wandb`, not even lazily inside a function
  (nor through `importlib.import_module` / `__import__` with a literal name);
* every module imports in a fresh interpreter, whichever is imported first.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "fl_lightning"
ROOT = "fl_lightning"

LAYERS: list[tuple[str, ...]] = [
    ("cli", "__main__"),
    ("testing",),  # the public golden-test kit: runs clients the way the runtime does
    ("runtime",),
    ("api",),  # the method author's import facade: re-exports config, methods and core names
    ("config",),
    ("methods",),
    ("server_steps", "text", "models", "data", "tracking"),
    # lean_imports and heavy_imports: how a process imports torchmetrics, and its heavy imports
    # with the collector paused; they import nothing of ours
    ("core", "lean_imports", "heavy_imports"),
    ("",),  # the root package itself
]
# the only imports within a layer (data -> models: a frozen-feature dataset computes its
# features with a model of ours; models -> text: the CLIP prompt learner's frozen text tower
# and soft prompts)
SIBLING_IMPORTS = {("__main__", "cli"), ("server_steps", "text"), ("data", "models"), ("models", "text")}
NO_RAY_OR_WANDB = ("core", "methods", "lean_imports", "heavy_imports")
FORBIDDEN_THERE = ("ray", "wandb")
RANK = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def unit_of(module: str) -> str:
    """`fl_lightning.data.registry` -> `data`; `fl_lightning.config` -> `config`; root -> ``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


@dataclass(frozen=True)
class Import:
    source: str  # importing module
    target: str  # imported module (a module of the package where it names one), or a third-party name
    line: int
    module_level: bool  # executed when the module is imported (not in a function, not TYPE_CHECKING)
    type_only: bool = False  # under `if TYPE_CHECKING:`


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve(source: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = source if is_package(source) else source.rpartition(".")[0]
    base = package.split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str) -> Iterator[Import]:
    tree = ast.parse(MODULES[module].read_text(), filename=str(MODULES[module]))

    def visit(node: ast.AST, module_level: bool, type_only: bool) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield Import(module, alias.name, child.lineno, module_level, type_only)
            elif isinstance(child, ast.ImportFrom):
                base = _resolve(module, child)
                for alias in child.names:
                    sub = f"{base}.{alias.name}"
                    target = sub if sub in MODULES else base
                    yield Import(module, target, child.lineno, module_level, type_only)
            elif isinstance(child, ast.Call) and _literal_import(child) is not None:
                yield Import(module, _literal_import(child) or "", child.lineno, False, type_only)
                yield from visit(child, module_level, type_only)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield from visit(child, False, type_only)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    yield from visit(ast.Module(body=[stmt], type_ignores=[]), False, True)
                for stmt in child.orelse:
                    yield from visit(ast.Module(body=[stmt], type_ignores=[]), module_level, type_only)
            else:
                yield from visit(child, module_level, type_only)

    yield from visit(tree, True, False)


def _literal_import(call: ast.Call) -> str | None:
    """`importlib.import_module("x")` / `import_module("x")` / `__import__("x")` -> "x"."""
    f = call.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    if name in ("import_module", "__import__") and call.args and isinstance(call.args[0], ast.Constant):
        value = call.args[0].value
        return value if isinstance(value, str) else None
    return None


IMPORTS: list[Import] = [imp for m in MODULES for imp in imports_of(m)]
INTERNAL = [i for i in IMPORTS if i.target == ROOT or i.target.startswith(ROOT + ".")]


def where(i: Import) -> str:
    return f"{MODULES[i.source].relative_to(REPO)}:{i.line}: {i.source} -> {i.target}"


def test_every_unit_has_a_layer():
    units = {unit_of(m) for m in MODULES}
    assert units <= set(RANK), f"modules outside the layer table: {sorted(units - set(RANK))}"


def allowed(source_unit: str, target_unit: str) -> bool:
    """Same unit, a lower layer (a larger index in LAYERS), or a listed sibling."""
    if source_unit == target_unit or RANK[source_unit] < RANK[target_unit]:
        return True
    return RANK[source_unit] == RANK[target_unit] and (source_unit, target_unit) in SIBLING_IMPORTS


def test_no_upward_import():
    bad = sorted({where(i) for i in INTERNAL if not allowed(unit_of(i.source), unit_of(i.target))})
    assert not bad, (
        "imports against the layers (cli > runtime > config > methods > "
        "server_steps|text|models|data|tracking > core):\n" + "\n".join(bad)
    )


def test_root_package_imports_nothing_of_the_package():
    assert not [where(i) for i in INTERNAL if i.source == ROOT]


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                strong(w)
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

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(MODULES)))
    for v in sorted(edges):
        if v not in index:
            strong(v)
    return out


def _loads_own_member(i: Import) -> bool:
    """A package `__init__` importing one of its own submodules (registration, loading)."""
    return is_package(i.source) and i.target.rpartition(".")[0] == i.source


def test_no_import_cycle():
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for i in INTERNAL:
        if not i.type_only and i.target in MODULES and i.target != i.source and not _loads_own_member(i):
            edges[i.source].add(i.target)
    assert not _cycles(edges), f"import cycles between modules: {_cycles(edges)}"


def test_type_only_imports_close_no_loop_across_units():
    """The run config's old loop (core.method, data, 29 method configs -> config -> methods,
    data, under `if TYPE_CHECKING:`) is gone: counting type-only imports too, a cycle stays
    inside one unit (a type hint between two modules of `core`, a package loading its members).
    A package's loading of its members counts here: `from ..config import RootConfig` ran
    `config/__init__`, which loads the methods' registry through `config.typed`."""
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for i in INTERNAL:
        if i.target in MODULES and i.target != i.source:
            edges[i.source].add(i.target)
    across = [c for c in _cycles(edges) if len({unit_of(m) for m in c}) > 1]
    assert not across, f"import cycles across units (type-only imports counted): {across}"


def _registered_names(registry: str) -> dict[str, str]:
    """Every name registered with `<registry>.register(name)` (a call or a decorator; `name` a
    string, or a module-level constant holding one), by the module that registers it."""
    out: dict[str, str] = {}
    for m, path in MODULES.items():
        tree = ast.parse(path.read_text())
        constants = {
            t.id: n.value.value
            for n in tree.body
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args):
                continue
            f, arg = node.func, node.args[0]
            if f.attr == "register" and isinstance(f.value, ast.Name) and f.value.id == registry:
                name = arg.value if isinstance(arg, ast.Constant) else constants.get(getattr(arg, "id", ""))
                if isinstance(name, str):
                    out[name] = m
    return out


def test_the_generic_runtime_names_no_dataset_and_no_model():
    """What a dataset or a model knows of itself (its metrics, groups, flags) is registered with
    it (`DatasetEntry`, `ModelTraits`): `runtime/` imports no module that registers one and
    holds no registered name as a string (`fmnist_digits20`, `ctran`)."""
    registered = {**_registered_names("DATASETS"), **_registered_names("MODELS")}
    assert {"fmnist_digits20", "ctran", "cnn"} <= set(registered)  # the scan finds them
    runtime = [m for m in MODULES if unit_of(m) == "runtime"]
    bad = sorted({where(i) for i in INTERNAL if i.source in runtime and i.target in set(registered.values())})
    for m in runtime:
        for node in ast.walk(ast.parse(MODULES[m].read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in registered:
                bad.append(f"{MODULES[m].relative_to(REPO)}:{node.lineno}: names {node.value!r}")
    assert not bad, "runtime/ knows a dataset or a model by name:\n" + "\n".join(bad)


def test_core_and_methods_never_import_ray_or_wandb():
    bad = [
        where(i)
        for i in IMPORTS
        if unit_of(i.source) in NO_RAY_OR_WANDB and i.target.split(".")[0] in FORBIDDEN_THERE
    ]
    assert not bad, "core/ and methods/ must not import Ray or W&B:\n" + "\n".join(bad)


def test_the_contract_sees_known_violations():
    """The checks above are not vacuous: they flag a planted upward import, cycle and Ray import."""
    assert not allowed("core", "runtime") and not allowed("data", "config") and not allowed("text", "data")
    assert allowed("cli", "core") and allowed("server_steps", "text") and not allowed("text", "server_steps")
    assert _cycles({"x": {"y"}, "y": {"x"}}) == [["x", "y"]]
    lazy = textwrap.dedent(
        """
        def f():
            import ray.util
            return importlib.import_module("wandb")
        """
    )
    found = {
        n.names[0].name if isinstance(n, ast.Import) else _literal_import(n)
        for n in ast.walk(ast.parse(lazy))
        if isinstance(n, ast.Import) or (isinstance(n, ast.Call) and _literal_import(n))
    }
    assert found == {"ray.util", "wandb"}


# --- every module imports in a fresh interpreter ----------------------------------------------
# A fresh `python -c "import fl_lightning.X.Y"` per module costs ~80 x the torch/Lightning start.
# Instead one interpreter imports the third-party packages the modules import at module level
# (never a module of fl_lightning), then forks once per module: each child starts with no
# fl_lightning module loaded, exactly as a fresh interpreter would, and imports one module.
# The parent byte-compiles the package's files first (compiling, not importing, into a private
# pycache prefix) so that the children read them as an installed checkout does: where
# PYTHONDONTWRITEBYTECODE is set, each child compiled its ~30-130 modules again (a third of
# their CPU). Where the code comes from does not change the order in which it imports.
_FORK_IMPORTS = textwrap.dedent(
    """
    import gc, importlib, importlib.util, json, os, py_compile, shutil, sys, tempfile, traceback
    from pathlib import Path
    modules, warm, package = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
    for name in warm:
        try:
            importlib.import_module(name)
        except Exception:
            pass  # a missing optional dependency shows up in the child that needs it
    assert not [m for m in sys.modules if m == "fl_lightning" or m.startswith("fl_lightning.")]
    # what every child inherits, frozen, and its collector off: it would otherwise walk (and so
    # copy, page by page) the whole warm heap (Python's `gc.freeze` note); a child imports one
    # module and exits
    gc.disable()
    gc.freeze()
    sys.pycache_prefix, sys.dont_write_bytecode = tempfile.mkdtemp(prefix="fork_imports_"), False
    for src in map(str, Path(package).rglob("*.py")):
        py_compile.compile(src, cfile=importlib.util.cache_from_source(src), doraise=True)
    def start(module):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                importlib.import_module(module)
                msg = b""
            except BaseException:
                msg = traceback.format_exc().encode()
            with os.fdopen(w, "wb") as f:
                f.write(msg)
            os._exit(0)
        os.close(w)
        return pid, os.fdopen(r, "rb")

    failed, todo = {}, list(modules)
    while todo:  # two children at a time
        running = [(m, *start(m)) for m in (todo.pop(0) for _ in range(min(2, len(todo))))]
        for module, pid, pipe in running:
            with pipe:
                msg = pipe.read()
            os.waitpid(pid, 0)
            if msg:
                failed[module] = msg.decode(errors="replace")
    # nothing written any more: at exit a warm import's handlers imported more of its package,
    # whose bytecode recreated the removed prefix (a folder left in /tmp by every run)
    prefix, sys.pycache_prefix, sys.dont_write_bytecode = sys.pycache_prefix, None, True
    shutil.rmtree(prefix, ignore_errors=True)
    print(json.dumps(failed))
    """
)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.slow
def test_every_module_imports_first_in_a_fresh_interpreter():
    modules = [m for m in MODULES if not m.endswith("__main__")]  # __main__ runs the CLI
    warm = sorted(
        {
            i.target
            for i in IMPORTS
            if i.module_level and i.target.split(".")[0] not in {ROOT, "__future__", *sys.stdlib_module_names}
        }
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run(
        [sys.executable, "-c", _FORK_IMPORTS, json.dumps(modules), json.dumps(warm), str(REPO / ROOT)],
        # timeout: a bound for a hang, not a speed (~2 min on 2 quiet cores, over 5 at load 15-30)
        capture_output=True, text=True, cwd=REPO, env=env, timeout=1200,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    failed = json.loads(r.stdout.strip().splitlines()[-1])
    assert not failed, "modules that do not import when imported first:\n" + "\n".join(
        f"--- {m}\n{tb.strip().splitlines()[-1]}" for m, tb in failed.items()
    )


def test_python_dash_m_and_the_entry_point_name_the_same_main():
    cmd = [sys.executable, "-m", "fl_lightning", "--help"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0 and "usage: fl-lightning" in r.stdout, r.stderr
    pyproject = (REPO / "pyproject.toml").read_text()
    assert 'fl-lightning = "fl_lightning.cli.main:entrypoint"' in pyproject
