"""TensorFlow and Keras: the vocabulary only, so far (no rules yet: files are detected and left alone).

Detection uses it to say which API generation a file is written in.
"""

from __future__ import annotations

from ...codemod.vocabulary import Vocabulary

VOCABULARY = Vocabulary(
    framework="tensorflow",
    display_name="TensorFlow",
    runtime_module="dpmigrate.runtime.tensorflow",
    default_generation="tf2",
    generations=(  # most specific first
        ("tensorflow.keras.utils.multi_gpu_model", "keras-multi-gpu"),
        ("keras.utils.multi_gpu_model", "keras-multi-gpu"),
        ("tensorflow.compat.v1", "tf1-graph"),
        ("tensorflow.Session", "tf1-graph"),
        ("tensorflow.placeholder", "tf1-graph"),
        ("tensorflow.GradientTape", "tf2-custom-loop"),
        ("tensorflow.keras", "tf2-keras"),
        ("keras", "tf2-keras"),
    ),
)

RULES = ()
