"""What a test session fixes before a test imports its framework (read by tests/conftest.py)."""

import os

#: Tests that read TensorFlow's CPU allocator statistics (``get_memory_info``). Those need its BFC
#: allocator, which retries every failed allocation for 10 s, so on TensorFlow they run in a session of
#: their own, ``python -m pytest -m tf_allocator_stats`` (``python -m tests`` runs it), where the
#: conftest turns that allocator on; every other TensorFlow session skips them.
ALLOCATOR_STATS = "tf_allocator_stats"

#: Logical CPU devices of a TensorFlow session: the MirroredStrategy tests replicate over two.
TF_CPU_DEVICES = 2


def files_marked(mark: str) -> list[str]:
    """The test files that write ``mark.<mark>`` (``pytest.mark.tf_allocator_stats``), sorted, as absolute paths.

    A session of those tests alone collects only these files: collecting the others would import every
    test module only to deselect its tests. The conftest fails a session that finds the mark elsewhere.
    """
    root = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    found = []
    for folder, _, names in os.walk(root):
        for name in names:
            if name.startswith("test_") and name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    if f"mark.{mark}" in f.read():
                        found.append(path)
    return sorted(found)
