"""A barrier on Paddle's TCPStore that waits as long as the runtime's timeout, not gloo's fixed 30 s.

Measured with Paddle 3.3.1 on CPU: every gloo collective of a process group, ``barrier()`` included,
fails after a fixed 30 s (``gloo/transport/tcp/unbound_buffer.cc:80 TIMEOUT``; ``PADDLE_PG_TIMEOUT``
reaches NCCL groups only). So a rank waiting in ``dp.save``'s or ``main_process_first``'s barrier while
rank 0 writes a large checkpoint, downloads a dataset or evaluates for more than 30 s would crash the
job. The ranks meet instead on the job's TCPStore (the one rank 0 serves, which ``init_parallel_env``
registers as the default store): each adds 1 to a counter named after the barrier's sequence number and
polls it until all have arrived, for at most ``timeout_s`` seconds (``init(timeout=)`` /
``DPMIGRATE_TIMEOUT``). Every rank passes the same barriers in the same order, so the names agree.
"""

from __future__ import annotations

import itertools
import time


class StoreBarrier:
    def __init__(self, store, world_size: int, timeout_s: float):
        self.store, self.world_size, self.timeout_s = store, world_size, timeout_s
        self._sequence = itertools.count(1)

    @classmethod
    def from_default_store(cls, world_size: int, timeout_s: float) -> StoreBarrier | None:
        """On the store ``init_parallel_env`` registered, or None when there is none (then gloo's barrier)."""
        from paddle.distributed import collective

        store = getattr(collective, "_default_store", None)
        return None if store is None else cls(store, world_size, timeout_s)

    def wait(self, rank: int) -> None:
        key = f"dpmigrate/barrier/{next(self._sequence)}"
        arrived = self.store.add(key, 1)
        deadline, pause = time.monotonic() + self.timeout_s, 0.001
        while arrived < self.world_size:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"dpmigrate: rank {rank} waited {self.timeout_s:g} s in a barrier ({key}) and only {arrived} of "
                    f"{self.world_size} ranks arrived: a rank died, froze, or is running different code (a "
                    "barrier, dp.save or collective reached by some ranks only). Raise the timeout with "
                    "DPMIGRATE_TIMEOUT (dpmigrate launch --timeout S) for long rank-0-only work"
                )
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
            arrived = self.store.add(key, 0)
