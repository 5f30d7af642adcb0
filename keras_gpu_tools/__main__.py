"""`python -m keras_gpu_tools`: the `keras-gpu-tools` command."""

import sys

from keras_gpu_tools.cli import main

if __name__ == "__main__":  # importing this module (e.g. pkgutil walking the package) runs nothing
    sys.exit(main())
