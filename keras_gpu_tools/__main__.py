import sys

from keras_gpu_tools.cli import main

sys.exit(main())
