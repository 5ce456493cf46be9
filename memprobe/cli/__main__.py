import sys

from memprobe.cli import main

sys.exit(main())
