"""Print this rank's order of a set of words (tests/test_hash_seed.py): alike on every rank only when the ranks
hash strings alike, which is what a vocabulary built with ``list(set(words))`` needs."""
import json
import os

import torch  # noqa: F401 - the framework dpmigrate launch starts this job with

import dpmigrate.runtime.torch as dp

dp.init()
words = "the cat sat on the mat with a hat and a bat by the door".split()
print("ORDER " + json.dumps({"rank": dp.rank(), "seed": os.environ.get("PYTHONHASHSEED"), "order": list(set(words))}),
      flush=True)
