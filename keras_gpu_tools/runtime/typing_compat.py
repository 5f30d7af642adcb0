"""``override`` (PEP 698) on every supported Python: a misspelt hook fails the type check.

``typing.override`` from Python 3.12, else ``typing_extensions.override``, else a decorator
that only marks the method (``__override__ = True``), as the others do at run time.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, TypeVar

_F = TypeVar("_F", bound=Any)

if sys.version_info >= (3, 12):
    from typing import override
elif TYPE_CHECKING:
    from typing_extensions import override
else:
    try:
        from typing_extensions import override
    except ImportError:

        def override(method: _F) -> _F:
            """Marks ``method`` as overriding a base class's (checked by type checkers only)."""
            try:
                method.__override__ = True
            except (AttributeError, TypeError):  # an object that takes no attributes stays as it is
                pass
            return method


__all__ = ["override"]
