"""The import graph of ``sowstream/``: no cycle between modules, none between packages, and every
import points down the layers (issue 23).

Every import counts: top-level ones, those under ``if TYPE_CHECKING:`` and those inside functions,
relative and absolute. A type-only or deferred import is still a dependency; break a wrong one with
a port (a small ``Protocol`` in the lower package), not by hiding it. ``from pkg import name``
depends on the submodule ``pkg.name`` when there is one, else on ``pkg`` (its ``__init__``).
"""

from __future__ import annotations

import ast
import itertools
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = "sowstream"
SOURCE = Path(__file__).resolve().parents[2] / ROOT

# The layers, bottom to top. Each layer is a sequence of tiers, bottom to top; a package may import
# any package in a lower tier and none in its own or a higher one. Packages that share a tier are
# peers: they must not import each other. "sowstream" stands for the root __init__ and __main__;
# "errors" and "units" are the modules sowstream/errors.py and sowstream/units.py.
LAYERS: tuple[tuple[str, tuple[tuple[str, ...], ...]], ...] = (
    ("ground", (("errors", "units"), ("filters", "wire", "auth"), ("broker",))),
    ("pure", (("messagetypes",), ("sow",), ("subscriptions", "views", "queues"), ("config",))),
    ("runtime", (("engine", "client", "pipeline"),)),
    ("front", (("console",), ("cli",))),
    ("top", ((ROOT,),)),
)

# Imports between peers that the design allows, as (importer, imported) package pairs. Keep empty.
ALLOWED_PEER_IMPORTS: frozenset[tuple[str, str]] = frozenset()


@dataclass(frozen=True)
class Edge:
    """One import statement's dependency of ``source`` on ``target`` (both module names)."""

    source: str
    target: str
    file: str  # relative to the directory that holds the root package
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line} -> {self.target}"


def discover(source: Path, root: str) -> dict[str, tuple[Path, bool]]:
    """Every module under ``source`` by dotted name, with its file and whether it is a package."""
    modules: dict[str, tuple[Path, bool]] = {}
    for path in sorted(source.rglob("*.py")):
        parts = [root, *path.relative_to(source).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        modules[".".join(parts)] = (path, is_package)
    return modules


def _known(name: str, modules: Mapping[str, object]) -> str | None:
    """The longest prefix of the dotted ``name`` that is one of our modules."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _targets(
    node: ast.AST, module: str, is_package: bool, modules: Mapping[str, object]
) -> Iterable[str]:
    """The modules of ours that one import statement (or ``import_module("...")`` call) needs."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            found = _known(alias.name, modules)
            if found:
                yield found
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            package = module.split(".") if is_package else module.split(".")[:-1]
            base_parts = package[: len(package) - node.level + 1]
            base = ".".join([*base_parts, *([node.module] if node.module else [])])
        else:
            base = node.module or ""
        for alias in node.names:
            found = f"{base}.{alias.name}"
            yield found if found in modules else _known(base, modules) or ""
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute | ast.Name)
        and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
        == "import_module"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        found = _known(node.args[0].value, modules)
        if found:
            yield found


def collect(source: Path, root: str) -> tuple[dict[str, tuple[Path, bool]], list[Edge]]:
    """The modules under ``source`` and every import edge between two of them."""
    modules = discover(source, root)
    edges: dict[Edge, None] = {}  # one edge per statement and target, in the order found
    for module, (path, is_package) in modules.items():
        file = path.relative_to(source.parent).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in _targets(node, module, is_package, modules):
                if target and target != module:
                    edges[Edge(module, target, file, getattr(node, "lineno", 0))] = None
    return modules, sorted(edges, key=lambda e: (e.file, e.line, e.target))


def package_of(module: str, root: str = ROOT) -> str:
    """The top-level package of a module; the root ``__init__`` and ``__main__`` are ``root``."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] == "__main__":
        return root
    return parts[1]


def strongly_connected(nodes: Iterable[str], edges: Iterable[tuple[str, str]]) -> list[list[str]]:
    """The components of more than one node (Tarjan), each sorted, in a stable order."""
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = itertools.count()

    def visit(v: str) -> None:
        index[v] = low[v] = next(counter)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(set(nodes)):
        if node not in index:
            visit(node)
    return sorted(found)


def tiers() -> dict[str, tuple[int, str]]:
    """Each package's tier rank (bottom = 0) and its layer's name."""
    ranks: dict[str, tuple[int, str]] = {}
    rank = itertools.count()
    for layer, layer_tiers in LAYERS:
        for tier in layer_tiers:
            r = next(rank)
            for package in tier:
                assert package not in ranks, f"{package} is listed twice in LAYERS"
                ranks[package] = (r, layer)
    return ranks


def cycle_report(kind: str, components: list[list[str]], edges: list[Edge], key: str) -> str:
    """One paragraph per cycle: its members and the imports that hold it together."""
    lines = []
    for component in components:
        members = set(component)
        lines.append(f"{kind} cycle between {', '.join(component)}:")
        for edge in edges:
            a, b = (
                (edge.source, edge.target)
                if key == "module"
                else (package_of(edge.source), package_of(edge.target))
            )
            if a != b and a in members and b in members:
                lines.append(f"  {edge}")
    return "\n".join(lines)


def layer_violations(edges: Iterable[Edge]) -> list[str]:
    """Imports that point to the same tier (between peers not allowed) or up the layers."""
    ranks = tiers()
    found = []
    for edge in edges:
        source, target = package_of(edge.source), package_of(edge.target)
        if source == target or (source, target) in ALLOWED_PEER_IMPORTS:
            continue
        if source not in ranks or target not in ranks:
            continue  # test_every_package_has_a_layer reports it
        (source_rank, source_layer), (target_rank, target_layer) = ranks[source], ranks[target]
        if target_rank > source_rank:
            found.append(
                f"{edge}  ({source} [{source_layer}] imports up to {target} [{target_layer}])"
            )
        elif target_rank == source_rank:
            found.append(f"{edge}  ({source} and {target} are peers in [{source_layer}])")
    return found


@pytest.fixture(scope="module")
def graph() -> tuple[dict[str, tuple[Path, bool]], list[Edge]]:
    return collect(SOURCE, ROOT)


def test_every_package_has_a_layer(graph: tuple[dict[str, tuple[Path, bool]], list[Edge]]) -> None:
    modules, _ = graph
    ranks = tiers()
    packages = {package_of(m) for m in modules}
    assert packages - ranks.keys() == set(), "packages missing from LAYERS"
    assert ranks.keys() - packages == set(), "LAYERS names packages that do not exist"


def test_no_cycle_between_modules(graph: tuple[dict[str, tuple[Path, bool]], list[Edge]]) -> None:
    modules, edges = graph
    components = strongly_connected(modules, ((e.source, e.target) for e in edges))
    if components:
        pytest.fail("\n" + cycle_report("module", components, edges, "module"), pytrace=False)


def test_no_cycle_between_packages(graph: tuple[dict[str, tuple[Path, bool]], list[Edge]]) -> None:
    modules, edges = graph
    components = strongly_connected(
        {package_of(m) for m in modules},
        ((package_of(e.source), package_of(e.target)) for e in edges),
    )
    if components:
        pytest.fail("\n" + cycle_report("package", components, edges, "package"), pytrace=False)


def test_imports_point_down_the_layers(
    graph: tuple[dict[str, tuple[Path, bool]], list[Edge]],
) -> None:
    _, edges = graph
    violations = layer_violations(edges)
    if violations:
        pytest.fail("\n" + "\n".join(violations), pytrace=False)


# The checker itself, on a small made-up package: it must see every kind of import.


def _write(root: Path, files: Mapping[str, str]) -> Path:
    for name, text in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


def test_checker_counts_every_kind_of_import(tmp_path: Path) -> None:
    source = _write(
        tmp_path,
        {
            "__init__.py": "from pkg.a import thing\n",
            "a/__init__.py": "from . import low\nfrom .low import x\n",
            "a/low.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from pkg.b.high import H\n"
                "def f():\n    from ..b import high\n    import pkg.b.other.deep\n"
                "import importlib\nimportlib.import_module('pkg.b.dyn')\n"
            ),
            "b/__init__.py": "",
            "b/high.py": "from pkg.a.low import x\n",
            "b/other.py": "",
            "b/dyn.py": "",
        },
    )
    modules, edges = collect(source, "pkg")
    found = {(e.source, e.target, e.line) for e in edges}
    assert found == {
        ("pkg", "pkg.a", 1),
        ("pkg.a", "pkg.a.low", 1),
        ("pkg.a", "pkg.a.low", 2),
        ("pkg.a.low", "pkg.b.high", 3),  # under TYPE_CHECKING
        ("pkg.a.low", "pkg.b.high", 5),  # inside a function, relative, submodule by name
        ("pkg.a.low", "pkg.b.other", 6),  # the longest prefix that is a module
        ("pkg.a.low", "pkg.b.dyn", 8),  # importlib.import_module with a constant
        ("pkg.b.high", "pkg.a.low", 1),
    }
    assert strongly_connected(modules, ((e.source, e.target) for e in edges)) == [
        ["pkg.a.low", "pkg.b.high"]
    ]
    packages = strongly_connected(
        {package_of(m, "pkg") for m in modules},
        ((package_of(e.source, "pkg"), package_of(e.target, "pkg")) for e in edges),
    )
    assert packages == [["a", "b"]]
    report = cycle_report("module", [["pkg.a.low", "pkg.b.high"]], edges, "module")
    assert "pkg/a/low.py:3 -> pkg.b.high" in report
    assert "pkg/b/high.py:1 -> pkg.a.low" in report


def test_checker_reports_an_import_up_the_layers() -> None:
    up = Edge("sowstream.sow.fold", "sowstream.engine.app", "sowstream/sow/fold.py", 7)
    peer = Edge("sowstream.engine.app", "sowstream.client.client", "sowstream/engine/app.py", 9)
    down = Edge("sowstream.engine.app", "sowstream.sow.fold", "sowstream/engine/app.py", 3)
    assert layer_violations([up, peer, down]) == [
        "sowstream/sow/fold.py:7 -> sowstream.engine.app"
        "  (sow [pure] imports up to engine [runtime])",
        "sowstream/engine/app.py:9 -> sowstream.client.client"
        "  (engine and client are peers in [runtime])",
    ]


# Only the runtime modules of the engine use faust (and aiokafka, its Kafka client; mode, its
# service library): engine/runtime.py and the runtime_*.py modules beside it. The rest of the
# engine reaches them through the ports (sowstream.engine.ports) and the units' Wiring.
RUNTIME_LIBRARIES = frozenset({"faust", "aiokafka", "mode"})


def is_runtime_module(module: str, root: str = ROOT) -> bool:
    """Whether ``module`` is one of the engine's runtime modules, which may import faust."""
    return module == f"{root}.engine.runtime" or module.startswith(f"{root}.engine.runtime_")


def library_imports(path: Path, libraries: frozenset[str]) -> list[tuple[int, str]]:
    """(line, name) of every import of one of ``libraries`` in a file: top-level, under
    ``TYPE_CHECKING``, inside functions, or by ``importlib.import_module("...")``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
            == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names = [node.args[0].value]
        found.extend((node.lineno, n) for n in names if n.split(".")[0] in libraries)
    return found


def runtime_leaks(modules: Mapping[str, tuple[Path, bool]], root: str) -> list[str]:
    """Imports of faust, aiokafka or mode in an engine module that is not a runtime module."""
    leaks = []
    for module, (path, _) in modules.items():
        if not module.startswith(f"{root}.engine.") or is_runtime_module(module, root):
            continue
        for line, name in library_imports(path, RUNTIME_LIBRARIES):
            leaks.append(f"{module}:{line} imports {name}")
    return leaks


def test_only_the_runtime_modules_of_the_engine_import_faust(
    graph: tuple[dict[str, tuple[Path, bool]], list[Edge]],
) -> None:
    modules, _ = graph
    assert f"{ROOT}.engine.runtime" in modules
    assert library_imports(modules[f"{ROOT}.engine.runtime"][0], RUNTIME_LIBRARIES)
    leaks = runtime_leaks(modules, ROOT)
    if leaks:
        pytest.fail("\nonly the engine's runtime modules import faust:\n" + "\n".join(leaks))


def test_checker_finds_every_kind_of_faust_import(tmp_path: Path) -> None:
    source = _write(
        tmp_path,
        {
            "__init__.py": "",
            "engine/__init__.py": "",
            "engine/runtime.py": "import faust\n",
            "engine/runtime_extra.py": "from aiokafka.errors import KafkaError\n",
            "engine/plain.py": "from faust.types import TP\n",
            "engine/checked.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    import mode\n"
                "def f():\n    import aiokafka.producer\n"
                "import importlib\nimportlib.import_module('faust.tables')\n"
            ),
            "engine/fine.py": "import faustian\nfrom . import runtime\n",
            "other.py": "import faust\n",  # not the engine
        },
    )
    modules, _ = collect(source, "pkg")
    assert sorted(runtime_leaks(modules, "pkg")) == [
        "pkg.engine.checked:3 imports mode",
        "pkg.engine.checked:5 imports aiokafka.producer",
        "pkg.engine.checked:7 imports faust.tables",
        "pkg.engine.plain:1 imports faust.types",
    ]
