"""``python -m dpmigrate.launch``: the same as ``dpmigrate launch``."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
