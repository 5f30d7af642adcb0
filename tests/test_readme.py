"""README.md is exactly right: its snippets run as written, its commands are the CLI's, its demo runs and reads well.

The README's Python blocks run in order in one namespace, in a fresh process whose working
directory is a temporary one (the snippets write `logs/`), as a reader would paste them into
one script after the stand-in block that makes `model`, `x`, `y` and `dataset`. A block
preceded by a marker comment runs only where the marker allows:

    <!-- snippet: gpu: why it needs one -->    runs only where NVML sees a GPU

Any other marker, or a marker that is not right above a Python block, fails the test.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass

import pytest

from tests.helpers.gpu import HAS_GPU

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
EXAMPLES = os.path.join(ROOT, "examples")
MARKER = re.compile(r"<!--\s*snippet:\s*([\w-]+)\s*(?::\s*(.*?))?\s*-->")
KINDS = {"gpu"}
WIDEST = 200  # characters: the widest line the demo may print
NATIVE_LOG_LINE = re.compile(r"[IWEF]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [^ \]]+\] ")  # absl's prefix


@dataclass
class Snippet:
    line: int  # 1-based line of the block's first code line in the README
    code: str
    kind: str | None  # None: runs everywhere; "gpu": only where a GPU is present
    why: str


def python_snippets(text: str) -> list[Snippet]:
    """The ```python blocks of a Markdown text with their markers; ValueError for a marker out of place."""
    lines = text.splitlines()
    snippets: list[Snippet] = []
    used: set[int] = set()
    i = 0
    while i < len(lines):
        if lines[i].strip() != "```python":
            i += 1
            continue
        end = next((k for k in range(i + 1, len(lines)) if lines[k].strip() == "```"), None)
        if end is None:
            raise ValueError(f"line {i + 1}: a ```python block that is never closed")
        above = i - 1
        while above >= 0 and not lines[above].strip():
            above -= 1
        kind, why = None, ""
        m = MARKER.fullmatch(lines[above].strip()) if above >= 0 else None
        if m:
            kind, why = m.group(1), m.group(2) or ""
            if kind not in KINDS:
                raise ValueError(f"line {above + 1}: unknown snippet marker {kind!r}; expected one of {sorted(KINDS)}")
            if not why:
                raise ValueError(f"line {above + 1}: the snippet marker {kind!r} does not say why")
            used.add(above)
        snippets.append(Snippet(i + 2, "\n".join(lines[i + 1 : end]) + "\n", kind, why))
        i = end + 1
    for k, line in enumerate(lines):
        if "<!--" in line and "snippet:" in line and k not in used:
            raise ValueError(f"line {k + 1}: a snippet marker that is not right above a ```python block")
    return snippets


def test_markers_are_read_and_checked():
    text = "a\n```python\nx = 1\n```\n<!-- snippet: gpu: needs a GPU -->\n\n```python\ny = x\n```\n"
    assert [(s.line, s.code, s.kind, s.why) for s in python_snippets(text)] == [
        (3, "x = 1\n", None, ""),
        (8, "y = x\n", "gpu", "needs a GPU"),
    ]
    with pytest.raises(ValueError, match="unknown snippet marker 'slow'"):
        python_snippets("<!-- snippet: slow: long -->\n```python\npass\n```\n")
    with pytest.raises(ValueError, match="does not say why"):
        python_snippets("<!-- snippet: gpu -->\n```python\npass\n```\n")
    with pytest.raises(ValueError, match="line 1: a snippet marker that is not right above"):
        python_snippets("<!-- snippet: gpu: a GPU -->\ntext\n```python\npass\n```\n")


def readme() -> str:
    with open(README, encoding="utf-8") as f:
        return f.read()


def test_readme_snippets_are_python_and_only_the_planner_needs_a_gpu():
    snippets = python_snippets(readme())
    assert len(snippets) >= 8
    for s in snippets:
        ast.parse(s.code, filename=f"README.md:{s.line}")
    gpu_only = [s.code.splitlines()[0] for s in snippets if s.kind == "gpu"]
    assert gpu_only == [
        "from keras_gpu_tools import OOMBatchSizeReducer, plan_batch_size",
        'plan = plan_batch_size(model, x, y, objective="throughput", max_seconds=120, log_dir="logs")',
    ]


RUNNER = """\
import json, sys
readme, blocks = sys.argv[1], json.load(open(sys.argv[2]))
ns = {"__name__": "__main__"}
for line, code in blocks:
    print(f"=== README.md:{line}", flush=True)
    exec(compile("\\n" * (line - 1) + code, readme, "exec"), ns)  # tracebacks name README.md's lines
print("=== all ran", flush=True)
"""


@pytest.mark.slow
def test_readme_snippets_run_as_written(tmp_path, backend):
    if backend != "tensorflow":
        pytest.skip("the README's snippets are run in the quick start's environment: the TensorFlow backend")
    snippets = [s for s in python_snippets(readme()) if s.kind is None or (s.kind == "gpu" and HAS_GPU)]
    blocks = tmp_path / "blocks.json"
    blocks.write_text(json.dumps([(s.line, s.code) for s in snippets]))
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, KERAS_BACKEND="tensorflow", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, README, str(blocks)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert [int(m) for m in re.findall(r"^=== README\.md:(\d+)$", proc.stdout, re.M)] == [s.line for s in snippets]
    assert proc.stdout.rstrip().endswith("=== all ran")
    # What the snippets say they write is there.
    assert (work / "logs" / "report.html").stat().st_size > 0 and (work / "again.html").stat().st_size > 0
    for run in ("gpu", "input", "profile", "oom", "train"):
        assert (work / "logs" / run).is_dir(), run
    assert list((work / "logs" / "profile" / "plugins" / "profile").iterdir())  # the ProfilerWindow's traces


# -- the CLI ---------------------------------------------------------------------------------------
def cli_commands(text: str) -> list[list[str]]:
    """Every `keras-gpu-tools ...` command of a Markdown text (code spans and bash blocks), as arguments.

    Usage brackets are dropped (`[-o report.html]` is the option and its value).
    """
    fences = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
    lines = [line for lang, body in fences.findall(text) if lang == "bash" for line in body.splitlines()]
    spans = [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", fences.sub("", text))]
    commands = []
    for part in (p.strip() for chunk in lines + spans for p in chunk.split("&&")):
        if part.split()[:1] == ["keras-gpu-tools"]:
            commands.append(shlex.split(part.replace("[", " ").replace("]", " "))[1:])
    return commands


def test_every_cli_command_of_the_readme_is_one_the_cli_takes(capsys):
    from keras_gpu_tools.cli.app import build_parser

    parser = build_parser()
    commands = cli_commands(readme())
    assert {c[0] for c in commands} == {"doctor", "demo", "report"}
    for args in commands:
        if len(args) == 1:  # the command named in prose ("printed by `keras-gpu-tools report`")
            continue
        try:
            parser.parse_args(args)
        except SystemExit:
            pytest.fail(f"the README's `keras-gpu-tools {' '.join(args)}`: {capsys.readouterr().err}")


def test_the_demo_writes_where_the_readme_and_the_help_say():
    from keras_gpu_tools.cli.app import build_parser

    parser = build_parser()
    quick_start = next(c for c in cli_commands(readme()) if c[0] == "demo")
    readme_dir = parser.parse_args(quick_start).logdir
    default = parser.parse_args(["demo"]).logdir
    assert default == readme_dir  # the quick start spells out the default
    sub = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert f"(default: {default})" in " ".join(sub["demo"].format_help().split())
    assert f"(e.g. {default}," in " ".join(sub["report"].format_help().split())
    text = readme()
    assert f"keras-gpu-tools report {default}" in text and f"tensorboard --logdir {default}" in text


def run_cli(*args: str, cwd) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "keras_gpu_tools", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow
def test_the_readme_demo_writes_the_logs_and_the_report_in_lines_of_200_characters_at_most(tmp_path):
    """The quick start's demo command as written, once (a TensorFlow start and a fit): what it prints
    and writes, then `keras-gpu-tools report` rebuilding the report from its log directory."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    first = re.search(r"```bash\n(.*?)```", readme(), re.S)
    assert first is not None
    demo = next(part.strip() for part in first.group(1).split("&&") if "keras-gpu-tools demo" in part)
    args = shlex.split(demo)[1:]
    proc = run_cli(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Trained " in proc.stdout
    # TensorFlow's own C++ log lines at its import (absl's "I0000 00:00:... port.cc:153] ...") are the
    # framework's, not the demo's; every other line, on stdout or stderr, is checked.
    ours = [line for line in (proc.stdout + proc.stderr).splitlines() if not NATIVE_LOG_LINE.match(line)]
    wide = [line for line in ours if len(line) > WIDEST]
    assert not wide, "\n".join(f"{len(line)} characters: {line[:300]}" for line in wide)

    # What it wrote: TensorBoard runs beside Keras's own, and the report.
    given = args[args.index("--logdir") + 1]
    logdir = tmp_path.resolve() / given  # the demo prints the report's absolute path
    assert f"tensorboard --logdir {given}" in proc.stdout
    acc = EventAccumulator(str(logdir / "gpu"))
    acc.Reload()
    assert "host/cpu_percent" in acc.Tags()["scalars"]
    assert (logdir / "train").is_dir()  # Keras's own TensorBoard run next to ours
    for run in ("input", "profile", "report"):
        assert (logdir / run).is_dir(), run
    assert "InputBoundDetector: Your program is" in proc.stdout
    assert "MemoryLeakDetector: " in proc.stdout and (logdir / "memory").is_dir()
    # The profiled window's own input wait, its span named, beside xprof's conclusion.
    assert "ProfilerWindow: " in proc.stdout and "steps 21-25, this window only" in " ".join(proc.stdout.split())
    html_path = logdir / "report.html"
    assert f"HTML report:      {html_path}" in proc.stdout
    page = html_path.read_text()
    figures = re.findall(r'data-figure="([^"]+)"><img alt="[^"]*" src="data:image/png;base64,', page)
    assert {"host", "step_time", "training"} <= set(figures)
    assert sorted(p.name for p in (logdir / "report_png").iterdir()) == sorted(f"{f}.png" for f in figures)

    # `keras-gpu-tools report` rebuilds it from the log directory alone.
    out = tmp_path / "again.html"
    proc = run_cli("report", str(logdir), "--output", str(out), "--png", str(tmp_path / "png"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for heading in (
        "GPUs and host",
        "Step time",
        "Input pipeline",
        "Profiler windows",
        "Mixed precision",
        "Memory over time",
    ):
        assert f"\n{heading}\n" in proc.stdout
    assert "No mixed-precision finding." in proc.stdout  # kept in the log dir by the demo
    widest = max(proc.stdout.splitlines(), key=len)
    assert len(widest) <= 200, widest  # the prose wrapped for a terminal
    again = out.read_text()
    assert set(re.findall(r'data-figure="([^"]+)"', again)) == set(figures)
    assert len(list((tmp_path / "png").iterdir())) == len(figures)


def test_the_doctor_prints_no_line_wider_than_200_characters():
    from keras_gpu_tools.cli import doctor

    text = doctor.run()  # what `keras-gpu-tools doctor` prints on this machine
    assert "Findings" in text
    wide = [line for line in text.splitlines() if len(line) > WIDEST]
    assert not wide, "\n".join(f"{len(line)} characters: {line[:300]}" for line in wide)


# -- the examples ----------------------------------------------------------------------------------
def example_paths() -> list[str]:
    return sorted(os.path.join(EXAMPLES, n) for n in os.listdir(EXAMPLES) if n.endswith(".py"))


def test_every_example_says_what_it_needs():
    for path in example_paths():
        with open(path, encoding="utf-8") as f:
            doc = ast.get_docstring(ast.parse(f.read())) or ""
        assert re.search(r"^Needs: .+", doc, re.M), f"{path}: no 'Needs: ...' line in its docstring"


def test_an_example_without_jax_says_what_to_install_instead_of_a_traceback(tmp_path):
    # As from the quick start's environment, which installs TensorFlow only: `import jax` fails.
    hide_jax = (
        "import runpy, sys; sys.modules['jax'] = None; sys.argv = sys.argv[1:]; "
        "runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    script = os.path.join(EXAMPLES, "two_processes.py")
    proc = subprocess.run(
        [sys.executable, "-c", hide_jax, script, "--epochs", "1", "--steps", "1", "--timeout", "120"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    assert 'pip install "jax[cpu]"' in proc.stderr, proc.stderr
