"""Per-sample fingerprints of a batch: how ``dpmigrate verify`` proves that the ranks split the data.

Equal final weights prove nothing when every rank read the whole batch (the averaged gradient is then
the single process's). So each process records, for every optimizer step, one short hash per sample it
consumed; the comparison checks that the ranks' samples are disjoint and together are the original's.
Hashes of the raw bytes: the same sample in the same dtype hashes alike in both runs, whatever the
framework. NumPy only.
"""

from __future__ import annotations

import hashlib

DIGEST_BYTES = 8
MAX_DIMS = 2  # dimension 0 (batch-major), and 1 for the time-major sequences models often take


def first_array(batch, to_numpy, depth: int = 0):
    """The first array-like leaf of a batch: ``x`` of ``(x, y)``, of ``[x, y]`` or of ``{"image": x, ...}``."""
    if depth > 4:
        return None
    array = to_numpy(batch)
    if array is not None:
        return array
    if isinstance(batch, dict):
        items = list(batch.values())
    elif isinstance(batch, (list, tuple)):
        items = list(batch)
    else:
        return None
    for item in items:
        found = first_array(item, to_numpy, depth + 1)
        if found is not None:
            return found
    return None


def rows(array, dims: int = 1) -> dict[str, list[str]]:
    """``{"0": [hash of array[0], hash of array[1], ...], "1": [hash of array[:, 0], ...]}``."""
    import numpy as np

    array = np.ascontiguousarray(array)
    if array.ndim == 0:
        return {}
    out = {}
    for dim in range(min(dims, MAX_DIMS, array.ndim)):
        moved = np.ascontiguousarray(np.moveaxis(array, dim, 0)) if dim else array
        prefix = f"{moved.dtype.str}{moved.shape[1:]}".encode()
        out[str(dim)] = [hashlib.blake2b(prefix + row.tobytes(), digest_size=DIGEST_BYTES).hexdigest()
                         for row in moved]
    return out
