"""Read a checkpoint as the original single-card script would.

    paddle_load.py CKPT            load it into the plain dygraph MLP; print its keys and what did not fit
    paddle_load.py CKPT --values   print every tensor it holds, as nested lists (for static-graph checkpoints)
"""

import json
import sys

import numpy as np
import paddle

state = paddle.load(sys.argv[1])
if sys.argv[2:] == ["--values"]:
    print(json.dumps({k: np.asarray(v).tolist() for k, v in state.items()}))
    sys.exit(0)
model = paddle.nn.Sequential(paddle.nn.Linear(8, 16), paddle.nn.Tanh(), paddle.nn.Linear(16, 1))
missing, unexpected = model.set_state_dict(state)
print(json.dumps({"keys": sorted(state), "missing": list(missing), "unexpected": list(unexpected)}))
