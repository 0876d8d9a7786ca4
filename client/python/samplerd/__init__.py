"""samplerd: the Python client of the samplerd sampling service.

    import samplerd
    with samplerd.SamplerClient("127.0.0.1:50051") as client:
        step = client.sample(logits, [samplerd.Prefill("r0", row=0,
                                      params=samplerd.SamplingParams(temperature=0.7, seed=1))])
        print(step["r0"].token_ids)

See examples/decode_loop.py for a worker's step loop over shared memory, and samplerd.cuda for
PyTorch CUDA tensors.
"""
from ._proto import pb
from .channel import AsyncStepChannel, StepChannel
from .client import TLS, AsyncSamplerClient, AsyncStepStream, SamplerClient, StepStream
from .cuda import CudaRegion, ReadyEvent, TokenOutput
from .errors import RequestError, SamplerError
from .results import BatchResult, RequestResult, StepResult
from .shm import ShmRegion
from .step import (CudaLogits, Decode, Draft, NcclLogits, Prefill, SamplingParams, ShardedLogits,
                   ShmLogits, build_batch, build_step)

try:
    from importlib.metadata import version as _version

    __version__ = _version("samplerd")  # the repository's VERSION, as installed
except Exception:  # pragma: no cover - run from a source tree without installing
    __version__ = "unknown"
__all__ = [
    "pb", "TLS", "SamplerClient", "StepChannel", "AsyncStepChannel", "AsyncSamplerClient", "StepStream", "AsyncStepStream", "CudaRegion",
    "ReadyEvent", "SamplerError", "RequestError", "RequestResult", "StepResult", "ShmRegion",
    "Prefill", "Decode", "Draft", "SamplingParams", "ShmLogits", "CudaLogits", "NcclLogits",
    "ShardedLogits", "build_step", "build_batch", "BatchResult", "TokenOutput",
]
# The group follower (samplerd.follower.GroupFollower) imports torch: not loaded here.
