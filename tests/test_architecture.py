"""The package's structure: one direction of imports, backends named in one place only."""

import ast
import pathlib
import re

PKG = pathlib.Path(__file__).resolve().parents[1] / "keras_gpu_tools"


def module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imported(path: pathlib.Path, nodes, with_base: bool = True) -> set:
    """Modules of the package that `nodes` import: `module.name` for each name taken from a module
    (a submodule, or a name of it), and the module itself unless `with_base` is False."""
    pkg = module_name(path) if path.name == "__init__.py" else module_name(path).rsplit(".", 1)[0]
    out = set()
    for n in nodes:
        if isinstance(n, ast.Import):
            out |= {a.name for a in n.names if a.name.startswith("keras_gpu_tools")}
        elif isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                base = ".".join(pkg.split(".")[: len(pkg.split(".")) - n.level + 1] + ([base] if base else []))
            if base.startswith("keras_gpu_tools"):
                out |= ({base} if with_base else set()) | {f"{base}.{a.name}" for a in n.names}
    return out


def top_level_imports(path: pathlib.Path) -> set:
    """Modules of the package imported when `path` is imported (not inside functions)."""
    nodes = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If):  # `if TYPE_CHECKING:` blocks do not run
            nodes += [] if "TYPE_CHECKING" in ast.unparse(node.test) else node.body + node.orelse
        else:
            nodes.append(node)
    return imported(path, nodes)


def graph() -> dict:
    mods = {module_name(p): p for p in PKG.rglob("*.py")}
    return {name: {m for m in top_level_imports(p) if m in mods and m != name} for name, p in mods.items()}


def test_no_import_cycles():
    g = graph()
    state = {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in g[node]:
            if state.get(nxt) == "open":
                raise AssertionError("import cycle: " + " -> ".join(stack + [node, nxt]))
            if nxt not in state:
                visit(nxt, stack + [node])
        state[node] = "done"

    for node in g:
        if node not in state:
            visit(node, [])


# Each package's layer: a module imports only from lower layers and its own package, wherever the
# import stands (module level or inside a function); `if TYPE_CHECKING:` imports are for type
# checkers only. The log schema is a leaf that every layer reads.
LAYERS = {
    "keras_gpu_tools.errors": 0,
    "keras_gpu_tools.logdir.schema": 0,
    "keras_gpu_tools.runtime": 1,
    "keras_gpu_tools.logdir": 2,
    "keras_gpu_tools.telemetry": 3,
    "keras_gpu_tools.memory": 3,
    "keras_gpu_tools.profiling": 3,
    "keras_gpu_tools.input": 4,
    "keras_gpu_tools.mixed_precision": 4,
    "keras_gpu_tools.live": 4,
    "keras_gpu_tools.leaks": 4,
    "keras_gpu_tools.backends": 5,
    "keras_gpu_tools.callbacks": 6,
    "keras_gpu_tools.layers": 6,
    "keras_gpu_tools.planner": 6,
    "keras_gpu_tools.speedups": 7,  # find_speedups: trials over the planner, the layers and the backends
    "keras_gpu_tools.reporting": 8,
    "keras_gpu_tools.cli": 9,
    "keras_gpu_tools": 10,  # the public names (lazy), and `python -m keras_gpu_tools`
}


def layer_of(module: str) -> tuple[str, int]:
    """The most specific entry of LAYERS that holds ``module``."""
    best = max((k for k in LAYERS if module == k or module.startswith(k + ".")), key=len)
    return best, LAYERS[best]


def all_imports(path: pathlib.Path) -> set:
    """Modules of the package that `path` imports anywhere but under `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text())
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for b in node.body for n in ast.walk(b)}
    return imported(path, [n for n in ast.walk(tree) if id(n) not in skip], with_base=False)


def test_every_import_points_down_the_layers():
    mods = {module_name(p): p for p in PKG.rglob("*.py")}
    offenders = []
    for name, path in mods.items():
        home, rank = layer_of(name)
        for dep in all_imports(path):
            if dep not in mods:
                dep = dep.rsplit(".", 1)[0]  # a name imported from a module
            dep_home, dep_rank = layer_of(dep)
            if dep_home != home and dep_rank >= rank:
                offenders.append(f"{name} (layer {rank}) imports {dep} (layer {dep_rank})")
    assert not offenders, "\n".join(sorted(offenders))


def test_every_module_of_the_package_has_a_layer():
    for path in PKG.rglob("*.py"):
        assert layer_of(module_name(path))[0] != "keras_gpu_tools" or path.parent == PKG, path


def test_modules_stay_small():
    """One job per module: none over 600 lines, no callback (a thin Keras adapter) over 350."""
    big = []
    for path in PKG.rglob("*.py"):
        lines = len(path.read_text().splitlines())
        limit = 350 if path.parent.name == "callbacks" else 600
        if lines > limit:
            big.append(f"{path.relative_to(PKG.parent)}: {lines} lines (at most {limit})")
    assert not big, "\n".join(big)


def test_no_backend_name_comparisons_outside_the_backends():
    pattern = re.compile(
        r"""(==|!=|\bin)\s*\(?\s*["'](tensorflow|jax|torch)["']|["'](tensorflow|jax|torch)["']\s*(==|!=)"""
    )
    offenders = []
    for path in PKG.rglob("*.py"):
        if "backends" in path.parts:
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{path.relative_to(PKG.parent)}:{i}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


# Spelt in pieces so that this file does not itself refer to them.
OUTSIDE = ("/".join(("..", "shared")), "KERAS-" + "INTERNALS.md", "GPU-" + "MACHINE.md")


def test_nothing_refers_to_files_outside_the_repository():
    root = PKG.parent
    offenders = []
    for path in [*root.glob("keras_gpu_tools/**/*.py"), *root.glob("tests/**/*.py"), *root.glob("benchmarks/*")]:
        if path.is_file():
            text = path.read_text(errors="ignore")
            if any(ref in text for ref in OUTSIDE):
                offenders.append(str(path.relative_to(root)))
    assert not offenders, offenders
