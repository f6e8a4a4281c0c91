"""Which framework a top-level package belongs to: one table for the codemod's detection and the launcher.

Plain data, no imports, so ``dpmigrate launch`` can use it without loading libcst.
"""

FRAMEWORK_OF_PACKAGE = {
    "torch": "torch", "torchvision": "torch", "torchaudio": "torch", "torchtext": "torch",
    "tensorflow": "tensorflow", "keras": "tensorflow", "tf_keras": "tensorflow",
    "paddle": "paddle", "paddlenlp": "paddle",
}
