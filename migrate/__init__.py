"""dpmigrate: turn a single-GPU training script into a correct data-parallel one.

``dpmigrate train.py`` rewrites the script (the codemod, this package); the converted script imports
``dpmigrate.runtime.<framework>`` (the runtime adapter). Importing this package loads no framework.
"""

__version__ = "0.1.0"
