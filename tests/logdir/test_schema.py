"""The log layout is spelled once: keras_gpu_tools/logdir/schema.py."""

import ast
import pathlib
import re

from keras_gpu_tools.logdir import schema

PKG = pathlib.Path(__file__).resolve().parents[1] / "keras_gpu_tools"
SCHEMA = PKG / "logdir" / "schema.py"

# Every string the schema defines that names a tag, a key or a run (not the bare JSON keys, such as
# "host" or "job", which are ordinary words elsewhere too).
SPELLED = {
    value
    for name, value in vars(schema).items()
    if name.isupper() and isinstance(value, str) and "/" in value.strip("/") and not name.endswith("SUFFIX")
}


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def test_the_schema_names_the_tags_the_report_reads():
    assert {"input/verdict/data", "oom/events/data", "gpu/devices/data", "input/wait_fraction"} <= SPELLED
    assert schema.process_run(3) == "process_3"
    assert schema.PROCESS_RUN_RE.match("fit/process_3").groups() == ("fit", "3")
    assert schema.JOB_RUN_RE.match("fit/job")
    # steps 20 to 25 (exclusive, from 0) are "steps 21-25" in every view, and so named
    assert schema.profile_window(20, 25) == "profile/steps_21_25" and schema.window_label(20, 25) == "steps_21_25"
    assert schema.gpu_key(0, "utilization_percent") == "gpu/0/utilization_percent"


def test_no_other_module_spells_a_tag_key_or_run_name():
    offenders = []
    patterns = [re.compile(r"process_\{"), re.compile(r"^gpu/\{|^job/gpu/|^profile/steps_")]
    for path in PKG.rglob("*.py"):
        if path == SCHEMA:
            continue
        tree = ast.parse(path.read_text())
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                if node.value in SPELLED:
                    offenders.append(f"{path.relative_to(PKG.parent)}:{node.lineno}: {node.value!r}")
            elif isinstance(node, ast.JoinedStr):
                text = "".join(v.value if isinstance(v, ast.Constant) else "{" for v in node.values)
                if any(p.search(text) for p in patterns):
                    offenders.append(f"{path.relative_to(PKG.parent)}:{node.lineno}: f{text!r}")
    assert not offenders, "spell these with keras_gpu_tools.logdir.schema:\n" + "\n".join(offenders)
