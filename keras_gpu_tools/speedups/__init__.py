"""find_speedups: each known speed-up of a fit measured on the user's own model and input.

``find.py`` checks the arguments; ``finder.py`` runs the trials in order;
``inputs.py`` knows the input kinds and their changes; ``trials.py`` builds
the trial clones and the numerical check; ``rows.py`` decides each row from
its figures; ``report.py`` shows them and applies the compile-time changes.
No module here imports a framework at import time.
"""
