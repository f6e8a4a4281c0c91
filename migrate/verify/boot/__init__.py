"""The folder ``dpmigrate verify`` puts first on ``PYTHONPATH`` (it holds only ``sitecustomize.py``)."""
