"""The test suite's layout: it mirrors the package, and tests share code only through tests/helpers."""

import ast
import pathlib

TESTS = pathlib.Path(__file__).resolve().parent
PKG = TESTS.parent / "keras_gpu_tools"
# Folders of tests/ that are not a package of keras_gpu_tools: shared code, and jobs of several processes.
NOT_MIRRORED = {"helpers", "distributed"}


def _imported_modules(tree: ast.AST) -> list[str]:
    names = []
    for node in ast.walk(tree):  # inside functions too
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            names += [base] if node.module else [f"{base}{alias.name}" for alias in node.names]
    return names


def test_no_test_module_imports_another_test_module_or_the_conftest():
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        for name in _imported_modules(ast.parse(path.read_text())):
            last = name.rsplit(".", 1)[-1]
            if last.startswith("test_") or last == "conftest":
                offenders.append(f"{path.relative_to(TESTS.parent)}: imports {name}")
    assert not offenders, "move what they share to tests/helpers:\n" + "\n".join(offenders)


def test_every_test_folder_is_a_package():
    """Test modules are imported by their full name (tests.memory.test_recovery): basenames may repeat."""
    folders = {p.parent for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts}
    missing = sorted(str(f.relative_to(TESTS.parent)) for f in folders if not (f / "__init__.py").exists())
    assert not missing, missing


def test_test_folders_mirror_the_package():
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    packages = {p.parent.name for p in PKG.glob("*/__init__.py")}
    assert folders - NOT_MIRRORED <= packages, sorted(folders - NOT_MIRRORED - packages)


def test_every_file_the_docs_name_exists():
    """A path the docs give (`tests/...`, `keras_gpu_tools/...`, `benchmarks/...`) is one a maintainer can open."""
    import re

    root = TESTS.parent
    docs = [root / "README.md", root / "CONTRIBUTING.md", *root.glob("docs/**/*.md"), *root.glob("benchmarks/*.md")]
    named = re.compile(r"\b((?:tests|keras_gpu_tools|benchmarks|notebooks|examples)/[\w/.-]*\.(?:py|ipynb|md|sh))\b")
    missing = [f"{d.name}: {p}" for d in docs for p in named.findall(d.read_text()) if not (root / p).exists()]
    assert not missing
