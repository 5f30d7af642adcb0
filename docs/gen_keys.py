"""Writes docs/keys.md and the README's key tables from keras_gpu_tools/callbacks/keys.py.

Run from the repository's root: `python docs/gen_keys.py`. tests/callbacks/test_keys_doc.py fails
when the committed files differ from what this writes.
"""

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from keras_gpu_tools.callbacks import keys  # noqa: E402


def main() -> None:
    (ROOT / "docs" / "keys.md").write_text(keys.keys_markdown())
    readme = ROOT / "README.md"
    readme.write_text(keys.readme_with_tables(readme.read_text()))


if __name__ == "__main__":
    main()
