"""Framework-neutral tuning knobs, from the seeds' advice, mapped by each backend onto its own.

torch: DDP ``bucket_cap_mb``, the fp16/bf16 compression comm hooks, post-local-SGD with a periodic
model averager, ``no_sync`` accumulation, ``find_unused_parameters``, ``SyncBatchNorm.convert_sync_batchnorm``
(CUDA only). Paddle: ``DistributedStrategy`` (fuse_grad_size_in_MB, use_hierarchical_allreduce, localsgd,
fp16_allreduce, gradient_merge, find_unused_parameters), ``paddle.nn.SyncBatchNorm.convert_sync_batchnorm``
(GPUs only). TF: ``CommunicationOptions``; its synchronised batch normalisation is a layer argument
(``BatchNormalization(synchronized=True)``).
A knob a backend cannot honour raises :class:`UnsupportedStrategy`; none is silently ignored.
"""

from __future__ import annotations

import dataclasses


class UnsupportedStrategy(ValueError):
    """A Strategy knob this backend has no native mapping for."""


@dataclasses.dataclass(frozen=True)
class Strategy:
    bucket_size_mb: float | None = None  # gradient fusion: size of one all-reduce bucket
    hierarchical_allreduce: bool = False  # reduce within a node first, then across nodes
    localsgd_steps: int | None = None  # average parameters every k optimizer steps, no per-step all-reduce
    localsgd_warmup_steps: int = 0  # plain synchronous steps before LocalSGD starts
    gradient_compression: str | None = None  # None, "fp16" or "bf16": all-reduce in half precision
    gradient_accumulation: int = 1  # micro-batches per optimizer step (communicate on the last only)
    sync_batchnorm: bool = False  # batch normalisation over the global batch: the framework's synchronised layers
    # some parameters get no gradient in a step (a layer called under a condition, or never): the gradient
    # reducer must not wait for them (torch DDP and Paddle DataParallel's find_unused_parameters; TF has no reducer)
    find_unused_parameters: bool = False

    def __post_init__(self):
        if self.bucket_size_mb is not None and not self.bucket_size_mb > 0:
            raise ValueError(f"Strategy(bucket_size_mb={self.bucket_size_mb!r}): must be a positive size in MB")
        if self.localsgd_steps is not None and (not isinstance(self.localsgd_steps, int) or self.localsgd_steps < 1):
            raise ValueError(f"Strategy(localsgd_steps={self.localsgd_steps!r}): must be an integer >= 1")
        if not isinstance(self.localsgd_warmup_steps, int) or self.localsgd_warmup_steps < 0:
            raise ValueError(f"Strategy(localsgd_warmup_steps={self.localsgd_warmup_steps!r}): must be an integer >= 0")
        if self.gradient_compression not in (None, "fp16", "bf16"):
            raise ValueError(
                f"Strategy(gradient_compression={self.gradient_compression!r}): use None, 'fp16' or 'bf16'"
            )
        if not isinstance(self.gradient_accumulation, int) or self.gradient_accumulation < 1:
            raise ValueError(
                f"Strategy(gradient_accumulation={self.gradient_accumulation!r}): must be an integer >= 1"
            )
        if self.localsgd_steps is not None and self.gradient_compression is not None:
            raise ValueError("Strategy: localsgd_steps and gradient_compression both replace the all-reduce; pick one")
