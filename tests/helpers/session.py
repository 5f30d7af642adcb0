"""What a test session fixes before a test imports its framework (read by tests/conftest.py)."""

#: Tests that read TensorFlow's CPU allocator statistics (``get_memory_info``). Those need its BFC
#: allocator, which retries every failed allocation for 10 s, so on TensorFlow they run in a session of
#: their own, ``python -m pytest -m tf_allocator_stats`` (``python -m tests`` runs it), where the
#: conftest turns that allocator on; every other TensorFlow session skips them.
ALLOCATOR_STATS = "tf_allocator_stats"

#: Logical CPU devices of a TensorFlow session: the MirroredStrategy tests replicate over two.
TF_CPU_DEVICES = 2
