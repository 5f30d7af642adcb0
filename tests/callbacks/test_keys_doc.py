"""docs/keys.md and the README's key tables are what keras_gpu_tools/callbacks/keys.py writes from the schema."""

from __future__ import annotations

import pathlib

import pytest

from keras_gpu_tools.callbacks import keys
from keras_gpu_tools.logdir import schema

ROOT = pathlib.Path(__file__).resolve().parents[2]
STALE = "{} is out of date with keras_gpu_tools/logdir/schema.py; regenerate it with `{}` from the repository's root"


def test_docs_keys_md_is_what_the_generator_writes():
    assert (ROOT / "docs" / "keys.md").read_text() == keys.keys_markdown(), STALE.format(
        "docs/keys.md", keys.REGENERATE
    )


def test_the_readmes_key_tables_are_what_the_generator_writes():
    text = (ROOT / "README.md").read_text()
    assert keys.readme_with_tables(text) == text, STALE.format("README.md", keys.REGENERATE)
    named = {m.group(2) for m in keys.README_TABLE.finditer(text)}
    assert named == {t.name for t in keys.tables() if not t.name.endswith("/job")}


def test_every_key_is_spelt_by_the_schema_and_given_once():
    spelt = {v for v in vars(schema).values() if isinstance(v, str)}
    rows = [row.key for table in keys.tables() for row in table.rows]
    assert len(rows) == len(set(rows))
    gpu = ("gpu/<i>/", schema.HOST_PREFIX, "job/gpu/")  # the telemetry's field tables name these
    assert [k for k in rows if k not in spelt and not k.startswith(gpu)] == []
    assert all(k.startswith(schema.OWN_PREFIXES) for k in rows)


def test_a_readme_marker_of_no_table_is_refused():
    with pytest.raises(ValueError, match="no key table named 'Nope'"):
        keys.readme_with_tables("<!-- keys:begin Nope -->\n<!-- keys:end -->\n")
    block = "a\n<!-- keys:begin OOMBatchSizeReducer -->\nold\n<!-- keys:end -->\nb\n"
    assert keys.readme_with_tables(block).split("\n")[2] == "| key | unit | meaning |"
