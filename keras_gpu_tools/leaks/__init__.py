"""Memory over time: whether a process's memory grows with each epoch or each fit(), how fast, and why.

Framework-free; the readings that differ per framework (allocator bytes, live
tensors, compiled functions) come from the backend (``backends/<fw>/leaks.py``).

- ``readings``: one reading of the process's memory (host, devices, tensors, compiled functions);
- ``slope``: a robust growth rate (Theil-Sen, the median of pairwise slopes);
- ``host``: this process's resident memory and the host's available memory;
- ``census``: live objects of given types, counted by a walk over the heap (costly: on demand);
- ``track``: one fit's readings per epoch and their growth after the warm-up;
- ``fits``: the process's store of every fit's figures, across fit() calls;
- ``verdict``: the rules (grows or stable, how fast, when memory runs out, the likely cause);
- ``advice``: each cause's words and fix;
- ``summary``: the verdict as text, and its event-file records.
"""
