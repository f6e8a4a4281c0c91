"""A script that seeds TensorFlow globally, then shuffles a repeated pipeline without a seed of its own, on 2 workers:
writes the first 6 elements each worker reads to ``order.rank<r>`` in the folder given."""

import json
import sys
from pathlib import Path

import tensorflow as tf

import dpmigrate.runtime.tensorflow as dp

dp.init()
tf.keras.utils.set_random_seed(5)
stream = dp.distributed_loader(tf.data.Dataset.range(64).repeat().shuffle(64).batch(2))
seen = [int(x) for batch in stream.take(3) for x in batch.numpy()]
Path(sys.argv[1], f"order.rank{dp.rank()}").write_text(json.dumps(seen))
