"""Per-sample fingerprints of a batch: how ``dpmigrate verify`` proves that the ranks split the data.

Equal final weights prove nothing when every rank read the whole batch (the averaged gradient is then
the single process's). So each process records, for every optimizer step, one short hash per sample it
consumed; the comparison checks that the ranks' samples are disjoint and together are the original's.
Hashes of the raw bytes of every array of a sample (features and labels): the same sample in the same dtype
hashes alike in both runs, whatever the framework. NumPy only.
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


def arrays(batch, to_numpy, depth: int = 0) -> list:
    """Every array-like leaf of a batch, in order: ``[x, y]`` of ``(x, y)``, of ``{"image": x, "label": y}``."""
    if depth > 4:
        return []
    array = to_numpy(batch)
    if array is not None:
        return [array]
    if isinstance(batch, dict):
        items = list(batch.values())
    elif isinstance(batch, (list, tuple)):
        items = list(batch)
    else:
        return []
    return [a for item in items for a in arrays(item, to_numpy, depth + 1)]


def rows(batch, dims: int = 1) -> dict[str, list[str]]:
    """``{"0": [hash of sample 0, hash of sample 1, ...], "1": [hash of batch[:, 0], ...]}``.

    ``batch`` is one array or a list of them (a sample's features and labels): a sample's hash along
    dimension 0 covers every array with the batch's length, so two ranks that read the same images with
    different labels read different samples. Dimension 1 (time-major inputs) is the first array's. A batch whose
    arrays have different lengths has no per-sample rows: nothing is recorded for it."""
    import numpy as np

    leaves = [np.ascontiguousarray(a) for a in (batch if isinstance(batch, (list, tuple)) else [batch])]
    leaves = [a for a in leaves if a.ndim > 0]
    if not leaves or len({len(a) for a in leaves}) > 1:
        return {}  # arrays of different lengths (a collate_fn packing the samples' tokens end to end): no samples
        # to tell apart, so nothing is claimed about the split
    first = leaves[0]
    out = {}
    for dim in range(min(dims, MAX_DIMS, first.ndim)):
        if dim == 0:
            together = [a for a in leaves if len(a) == len(first)]
        else:
            together = [np.ascontiguousarray(np.moveaxis(first, dim, 0))]
        prefix = "".join(f"{a.dtype.str}{a.shape[1:]}" for a in together).encode()
        out[str(dim)] = [hashlib.blake2b(prefix + b"".join(a[i].tobytes() for a in together),
                                         digest_size=DIGEST_BYTES).hexdigest() for i in range(len(together[0]))]
    return out
