"""Every collective of the TF runtime on each worker, results written as JSON (tests/test_tf_distributed.py).

    python tf_metrics.py FOLDER
"""

import json
import os
import sys

import tensorflow as tf
from tensorflow import keras

import dpmigrate.runtime.tensorflow as dp

folder = sys.argv[1]
r = dp.rank()
metric = keras.metrics.Sum()
metric.update_state(float(r + 1))
with dp.main_process_first():
    if r == 0:
        with open(os.path.join(folder, "cache"), "w") as f:
            f.write("filled by rank 0")
    cache_seen = open(os.path.join(folder, "cache")).read()
result = {
    "sum": dp.all_reduce(r + 1, op="sum"), "mean": dp.all_reduce(r + 1), "max": dp.all_reduce(r + 1, op="max"),
    "min": dp.all_reduce(r + 1.5, op="min"), "product": dp.all_reduce(r + 2, op="product"),
    "tensor_sum": dp.all_reduce(tf.constant([float(r), 10.0]), op="sum").numpy().tolist(),
    "metric": float(dp.all_reduce(metric, op="sum")),
    "gather": dp.all_gather(tf.range(r + 1)).numpy().tolist(),
    "gather_objects": dp.all_gather({"rank": r}),
    "broadcast_object": dp.broadcast("from rank 0" if r == 0 else "not this one"),
    "broadcast_tensor": float(dp.broadcast(tf.constant(r + 5.0), src=1)),
    "cache_seen": cache_seen,
}
dp.barrier()
with open(os.path.join(folder, f"result.rank{r}"), "w") as f:
    json.dump(result, f)
