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


def top_level_imports(path: pathlib.Path) -> set:
    """Modules of the package imported when `path` is imported (not inside functions)."""
    tree = ast.parse(path.read_text())
    out = set()
    pkg = module_name(path) if path.name == "__init__.py" else module_name(path).rsplit(".", 1)[0]
    for node in tree.body:
        nodes = [node]
        if isinstance(node, ast.If):  # `if TYPE_CHECKING:` blocks do not run
            test = ast.unparse(node.test)
            nodes = [] if "TYPE_CHECKING" in test else node.body + node.orelse
        for n in nodes:
            if isinstance(n, ast.Import):
                out |= {a.name for a in n.names if a.name.startswith("keras_gpu_tools")}
            elif isinstance(n, ast.ImportFrom):
                base = n.module or ""
                if n.level:
                    base = ".".join(pkg.split(".")[: len(pkg.split(".")) - n.level + 1] + ([base] if base else []))
                if base.startswith("keras_gpu_tools"):
                    out.add(base)
                    out |= {f"{base}.{a.name}" for a in n.names}
    return out


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


def test_layers_point_one_way():
    """_core imports neither the backends nor the callbacks; the backends do not import the callbacks."""
    for name, deps in graph().items():
        if name.startswith("keras_gpu_tools._core"):
            bad = {d for d in deps if d.startswith(("keras_gpu_tools.backends", "keras_gpu_tools.callbacks"))}
            assert not bad, f"{name} imports {bad}"
        if name.startswith("keras_gpu_tools.backends"):
            bad = {d for d in deps if d.startswith("keras_gpu_tools.callbacks")}
            assert not bad, f"{name} imports {bad}"


def test_no_backend_name_comparisons_outside_the_backends():
    pattern = re.compile(
        r"""(==|!=|\bin)\s*\(?\s*["'](tensorflow|jax|torch)["']|["'](tensorflow|jax|torch)["']\s*(==|!=)"""
    )
    offenders = []
    for path in PKG.rglob("*.py"):
        if "_backends" in path.parts:
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
