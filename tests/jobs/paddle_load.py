"""Load a checkpoint into the plain single-card model, as the original script would; print what did not fit."""

import json
import sys

import paddle

model = paddle.nn.Sequential(paddle.nn.Linear(8, 16), paddle.nn.Tanh(), paddle.nn.Linear(16, 1))
state = paddle.load(sys.argv[1])
missing, unexpected = model.set_state_dict(state)
print(json.dumps({"keys": sorted(state), "missing": list(missing), "unexpected": list(unexpected)}))
