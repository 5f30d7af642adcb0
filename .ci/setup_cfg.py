"""Reads what .ci/run needs from setup.cfg, with the standard library only.

    python3 .ci/setup_cfg.py extra lint       # the requirements of an extra, one a line
    python3 .ci/setup_cfg.py lowest keras     # the lowest version install_requires allows: 3.15.0
    python3 .ci/setup_cfg.py lowest-python    # the lowest Python python_requires allows: 3.11

So CI tests the bounds the package declares, and follows them when they change.
"""

import configparser
import os
import re
import sys

SETUP_CFG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "setup.cfg")


def _lines(value: str) -> list[str]:
    return [line.strip() for line in value.splitlines() if line.strip() and not line.strip().startswith("#")]


def _floor(spec: str, what: str) -> str:
    """The version after `>=` in a specifier such as `>=3.15,<4`, padded to three parts."""
    m = re.search(r">=\s*([0-9]+(?:\.[0-9]+)*)", spec)
    if not m:
        sys.exit(f"setup.cfg: {what} has no lower bound (>=): {spec!r}")
    parts = m.group(1).split(".")
    return ".".join((parts + ["0", "0"])[:3])


def main(argv: list[str]) -> None:
    cfg = configparser.ConfigParser(interpolation=None)
    if not cfg.read(SETUP_CFG):
        sys.exit(f"cannot read {SETUP_CFG}")
    if len(argv) == 2 and argv[0] == "extra":
        extras = cfg["options.extras_require"]
        if argv[1] not in extras:
            sys.exit(f"setup.cfg: no extra named {argv[1]!r}")
        print("\n".join(_lines(extras[argv[1]])))
    elif len(argv) == 2 and argv[0] == "lowest":
        for req in _lines(cfg["options"]["install_requires"]):
            m = re.match(r"([A-Za-z0-9_.-]+)\s*(.*)", req)
            if m and m.group(1).lower() == argv[1].lower():
                print(_floor(m.group(2), argv[1]))
                return
        sys.exit(f"setup.cfg: {argv[1]!r} is not in install_requires")
    elif argv == ["lowest-python"]:
        print(".".join(_floor(cfg["options"]["python_requires"], "python_requires").split(".")[:2]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
