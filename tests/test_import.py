"""The package imports lazily: no framework until a callback, layer or report is used.

Each check that looks at ``sys.modules`` runs in a fresh interpreter, since the
test process itself has long imported Keras and its backend.
"""

import ast
import configparser
import importlib
import importlib.util
import json
import os
import pkgutil
import subprocess
import sys

import pytest

import keras_gpu_tools

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "keras_gpu_tools")

# What `import keras_gpu_tools` and `keras-gpu-tools --help` must not import.
HEAVY = ("keras", "tensorflow", "jax", "torch", "matplotlib")
FRAMEWORKS = ("keras", "tensorflow", "jax", "torch")

# Modules that define Keras subclasses, so import Keras at module level by design;
# the lazy package __init__ files keep them out of `import keras_gpu_tools`.
IMPORTS_KERAS = {
    "keras_gpu_tools.callbacks._base",
    "keras_gpu_tools.callbacks._lean",
    "keras_gpu_tools.callbacks.gpu_utilization_logger",
    "keras_gpu_tools.callbacks.input_bound_detector",
    "keras_gpu_tools.callbacks.live_view",
    "keras_gpu_tools.callbacks.memory_leak_detector",
    "keras_gpu_tools.callbacks.mixed_precision_check",
    "keras_gpu_tools.callbacks.oom_batch_size_reducer",
    "keras_gpu_tools.callbacks.profiler_window",
    "keras_gpu_tools.layers.mixed_precision_output",
}

# Prints, as the last line of stdout, where the package came from and which of
# the heavy top-level modules are loaded; the code before it runs first.
_LOADED = (
    "\nimport json as _j, sys as _s, keras_gpu_tools as _k"
    "\nprint(_j.dumps({'file': _k.__file__, 'loaded': sorted({m.split('.')[0] for m in _s.modules} & set(%r))}))"
)


def run_python(*args, timeout=120):
    """Runs a fresh interpreter with `args`; it imports this checkout of the package."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)


def loaded_after(code, names=HEAVY):
    """The modules of `names` loaded after running `code` in a fresh interpreter."""
    proc = run_python("-c", code + _LOADED % (names,))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["file"].startswith(PACKAGE + os.sep), f"imported {result['file']}, not this checkout"
    return result["loaded"]


# -- import keras_gpu_tools ------------------------------------------------------------
def test_import_loads_no_framework():
    assert loaded_after("import keras_gpu_tools") == []


def test_errors_are_imported_eagerly_and_still_no_framework():
    code = (
        "import warnings, keras_gpu_tools\n"
        "from keras_gpu_tools import GPUMonitoringWarning, MixedPrecisionWarning\n"
        "warnings.simplefilter('ignore', GPUMonitoringWarning)\n"
        "assert 'MixedPrecisionWarning' in vars(keras_gpu_tools)"
    )
    assert loaded_after(code) == []


def test_subpackages_load_no_framework_until_a_name_is_used():
    code = "import keras_gpu_tools.callbacks, keras_gpu_tools.layers, keras_gpu_tools.errors, keras_gpu_tools.cli"
    assert loaded_after(code) == []


def test_first_access_imports_the_defining_module():
    code = (
        "import sys, keras_gpu_tools\n"
        "cls = keras_gpu_tools.GPUUtilizationLogger\n"
        "from keras_gpu_tools.callbacks.gpu_utilization_logger import GPUUtilizationLogger\n"
        "assert cls is GPUUtilizationLogger, cls\n"
        "assert vars(keras_gpu_tools)['GPUUtilizationLogger'] is cls  # cached: __getattr__ runs once\n"
        "assert keras_gpu_tools.callbacks.GPUUtilizationLogger is cls  # the subpackage, bound on first use\n"
        "import keras\n"
        "assert issubclass(cls, keras.callbacks.Callback)"
    )
    assert "keras" in loaded_after(code)


def test_from_import_of_a_public_name():
    from keras_gpu_tools import GPUUtilizationLogger
    from keras_gpu_tools.callbacks import gpu_utilization_logger

    assert GPUUtilizationLogger is gpu_utilization_logger.GPUUtilizationLogger
    assert GPUUtilizationLogger.__module__ == "keras_gpu_tools.callbacks.gpu_utilization_logger"


@pytest.mark.parametrize("module", ["keras_gpu_tools", "keras_gpu_tools.callbacks", "keras_gpu_tools.layers"])
def test_every_public_name_is_listed_by_dir_and_resolves(module):
    mod = importlib.import_module(module)
    assert set(mod.__all__) <= set(dir(mod))
    assert len(set(mod.__all__)) == len(mod.__all__)
    for name in mod.__all__:
        assert getattr(mod, name) is not None, name


def test_public_names_are_the_objects_of_their_defining_modules():
    from keras_gpu_tools import errors
    from keras_gpu_tools.layers import mixed_precision_output
    from keras_gpu_tools.mixed_precision import check as mixed_precision
    from keras_gpu_tools.reporting import report

    assert keras_gpu_tools.report is report.report
    assert keras_gpu_tools.TrainingReport is report.TrainingReport
    assert keras_gpu_tools.check_mixed_precision is mixed_precision.check_mixed_precision
    assert keras_gpu_tools.MixedPrecisionFinding is mixed_precision.MixedPrecisionFinding
    assert keras_gpu_tools.MixedPrecisionOutput is mixed_precision_output.MixedPrecisionOutput
    for name in errors.__all__:
        assert name in keras_gpu_tools.__all__, name
        assert getattr(keras_gpu_tools, name) is getattr(errors, name), name


@pytest.mark.parametrize("module", ["keras_gpu_tools", "keras_gpu_tools.callbacks", "keras_gpu_tools.layers"])
def test_unknown_attribute_raises_attribute_error_naming_module_and_attribute(module):
    mod = importlib.import_module(module)
    with pytest.raises(AttributeError, match=rf"module '{module}' has no attribute 'NoSuchThing'"):
        mod.NoSuchThing  # noqa: B018
    assert not hasattr(mod, "no_such_thing")
    with pytest.raises(ImportError):
        exec(f"from {module} import NoSuchThing", {})


@pytest.mark.parametrize(
    "path",
    ["keras_gpu_tools/__init__.py", "keras_gpu_tools/callbacks/__init__.py", "keras_gpu_tools/layers/__init__.py"],
)
def test_type_checkers_see_every_lazy_name(path):
    # The `if TYPE_CHECKING:` imports are what type checkers and IDEs see: they
    # must import exactly the names `__getattr__` resolves.
    tree = ast.parse(open(os.path.join(ROOT, path)).read())
    static = set()
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            static |= {alias.asname or alias.name for imp in node.body for alias in imp.names}
    module = importlib.import_module(path[: -len("/__init__.py")].replace("/", "."))
    assert static == set(module._LAZY)
    assert set(module._LAZY) <= set(module.__all__)
    # The other public names are bound at import, not resolved by accident.
    assert set(module.__all__) - set(module._LAZY) <= set(vars(module))


# -- every module of the package -------------------------------------------------------
def _modules():
    return sorted(info.name for info in pkgutil.walk_packages(keras_gpu_tools.__path__, "keras_gpu_tools."))


def test_the_walk_finds_the_package():
    names = _modules()
    assert {"keras_gpu_tools.errors", "keras_gpu_tools.telemetry.nvml", "keras_gpu_tools.cli"} <= set(names)
    assert IMPORTS_KERAS <= set(names), "IMPORTS_KERAS names a module that no longer exists"


@pytest.mark.parametrize("module", _modules())
def test_module_imports_no_framework(module):
    if module in IMPORTS_KERAS:
        pytest.skip(f"{module} defines Keras subclasses: it imports Keras at module level by design")
    assert loaded_after(f"import {module}", FRAMEWORKS) == []


# -- training on a backend that is not TensorFlow ----------------------------------------
_FIT_WITH_LOGS = """
import tempfile, warnings
import numpy as np, keras
import keras_gpu_tools as kgt
warnings.simplefilter('ignore')
d = tempfile.mkdtemp()
m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
m.compile('adam', 'mse')
x, y = np.zeros((64, 4), 'float32'), np.zeros((64, 1), 'float32')
m.fit(x, y, epochs=2, verbose=0, callbacks=[
    kgt.GPUUtilizationLogger(log_dir=d, interval=0.05), kgt.InputBoundDetector(log_dir=d, verbose=0),
    kgt.OOMBatchSizeReducer(log_dir=d, verbose=0), kgt.ProfilerWindow(log_dir=d, start_step=10**9, verbose=0),
    kgt.LiveView(), kgt.MixedPrecisionCheck()])
kgt.report(log_dir=d)
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_a_fit_writing_logs_on_jax_or_torch_imports_no_tensorflow(backend, monkeypatch):
    # TensorBoard's own event writer imports TensorFlow whenever it is installed: 2 s at the
    # start of the fit and a second framework in the process. Our writer needs none of it.
    for module in (backend, "tensorflow"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed: nothing to show here")
    monkeypatch.setenv("KERAS_BACKEND", backend)
    loaded = loaded_after(_FIT_WITH_LOGS, FRAMEWORKS)
    assert backend in loaded and "tensorflow" not in loaded  # (Keras itself may import JAX on torch)


# -- the command line ------------------------------------------------------------------
# Runs the command as `python -m keras_gpu_tools` does; argparse exits after the help.
_CLI = (
    "import runpy, sys\n"
    "sys.argv = ['keras-gpu-tools', *{args!r}]\n"
    "try:\n"
    "    runpy.run_module('keras_gpu_tools', run_name='__main__', alter_sys=True)\n"
    "except SystemExit as e:\n"
    "    assert e.code in (0, None), e.code\n"
)


@pytest.mark.parametrize(
    "args", [["--help"], ["doctor", "--help"], ["demo", "--help"], ["report", "--help"]], ids=" ".join
)
def test_cli_help_imports_no_framework(args):
    assert loaded_after(_CLI.format(args=args)) == []


def test_cli_help_is_fast():
    # Fast means importing little (about 0.1 s; 4 s when it imported Keras): the modules the real entry point
    # imports are counted (Python's -X importtime lists each), not its seconds, which a busy machine stretches.
    proc = run_python("-X", "importtime", "-m", "keras_gpu_tools", "--help")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "usage: keras-gpu-tools" in proc.stdout and "doctor" in proc.stdout
    imported = [line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")]
    assert "keras_gpu_tools.cli.app" in imported
    assert not [m for m in imported if m.split(".")[0] in HEAVY], imported
    # About 110 modules today with the interpreter's own; Keras alone imports over a thousand.
    assert len(imported) < 400, len(imported)


# -- packaging ----------------------------------------------------------------------------
def test_package_is_marked_typed():
    assert os.path.isfile(os.path.join(PACKAGE, "py.typed"))
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    assert "py.typed" in cfg["options.package_data"]["keras_gpu_tools"].split()


def test_a_saved_model_loads_after_import_keras_and_keras_gpu_tools(tmp_path):
    """The layer registers itself with Keras when Keras is already loaded, so a saved model finds it."""
    import keras

    from keras_gpu_tools import MixedPrecisionOutput

    # Saved here (a save needs no fresh interpreter), loaded in one that has not seen the layer yet.
    path = tmp_path / "m.keras"
    keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), MixedPrecisionOutput("softmax")]).save(path)
    load = (
        f"import keras, keras_gpu_tools; m = keras.saving.load_model({str(path)!r}); print(type(m.layers[-1]).__name__)"
    )
    out = subprocess.run([sys.executable, "-c", load], check=True, capture_output=True, text=True, timeout=300)
    assert out.stdout.strip().splitlines()[-1] == "MixedPrecisionOutput"
