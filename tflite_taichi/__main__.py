import sys

from tflite_taichi.cli import main

sys.exit(main())
