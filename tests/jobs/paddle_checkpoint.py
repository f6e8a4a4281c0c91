"""Read Paddle checkpoints for the fixture tests, so the test process never imports Paddle.

    paddle_checkpoint.py npz CKPT OUT.npz [CKPT OUT.npz ...]
        write every tensor of each checkpoint (paddle.load) to a .npz
    paddle_checkpoint.py load-into SCRIPT CLASS CKPT
        import SCRIPT as a module (its __main__ block does not run), build CLASS() and
        set_state_dict(paddle.load(CKPT)); print the keys of both and what did not fit, as JSON
"""

import importlib.util
import json
import sys

import numpy as np
import paddle

if sys.argv[1] == "npz":
    pairs = sys.argv[2:]
    for checkpoint, out in zip(pairs[::2], pairs[1::2]):
        np.savez(out, **{k: np.asarray(v) for k, v in paddle.load(checkpoint).items()})
elif sys.argv[1] == "load-into":
    script, cls, checkpoint = sys.argv[2:5]
    spec = importlib.util.spec_from_file_location("original_script", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = getattr(module, cls)()
    state = paddle.load(checkpoint)
    missing, unexpected = model.set_state_dict(state)
    print(json.dumps({"saved": sorted(state), "model": sorted(model.state_dict()),
                      "missing": list(missing), "unexpected": list(unexpected)}))
else:
    sys.exit(f"unknown command {sys.argv[1]!r}")
