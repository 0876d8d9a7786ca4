"""PyTorch CUDA tensors as samplerd CUDA_IPC regions, and the per-step ready event.

A worker keeps its logits in one CUDA tensor (the pool) and registers the pool's storage once.
Each step it writes logits into a view of the pool on its own stream, records a ReadyEvent on
that stream and sends the view's slice with the event's IPC handle: samplerd's stream waits on
the event before reading, so the worker never synchronises its host. Needs torch (imported
lazily: the shm and inline paths do not).

The storage's handle is PyTorch's own (`UntypedStorage._share_cuda_()`: version 2, type 'c',
the cudaIpcMemHandle_t of the caching allocator's block, and the storage's offset in that
block), which samplerd accepts as is. PyTorch's expandable segments
(`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`) have no such handle: samplerd refuses them
naming the setting. At exit PyTorch may warn "Producer process has been terminated before all
shared CUDA tensors released": its reference counter expects a PyTorch consumer, and samplerd
(not one) keeps the mapping only until UnregisterBuffer; unregister before freeing the tensor.
"""
import ctypes
from dataclasses import dataclass

from ._proto import pb


def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("samplerd's CUDA tensor path needs PyTorch (pip install torch)") from e
    return torch


@dataclass(frozen=True)
class CudaRegion:
    """A registered CUDA_IPC region: a tensor's storage, exported once."""

    name: str
    handle: bytes
    device_id: int
    byte_size: int      # the block's bytes up to the storage's end
    base_offset: int    # where the storage starts in the block
    data_ptr: int       # the storage's device address in this process

    @classmethod
    def from_tensor(cls, name: str, tensor) -> "CudaRegion":
        if not tensor.is_cuda:
            raise ValueError("register_cuda_tensor: the tensor is not on a CUDA device")
        storage = tensor.untyped_storage()
        device, handle, storage_bytes, storage_offset, *_ = storage._share_cuda_()
        return cls(name=name, handle=bytes(handle), device_id=int(device),
                   byte_size=int(storage_offset + storage_bytes), base_offset=int(storage_offset),
                   data_ptr=storage.data_ptr())

    def byte_offset_of(self, view) -> int:
        """The byte offset of a view of the registered tensor's storage, within the region."""
        offset = self.base_offset + view.data_ptr() - self.data_ptr
        end = offset + view.numel() * view.element_size()
        if view.data_ptr() < self.data_ptr or end > self.byte_size:
            raise ValueError(f"the view does not lie inside region {self.name!r}")
        return offset


class ReadyEvent:
    """An interprocess CUDA event recorded after the logits are written."""

    def __init__(self):
        torch = _torch()
        self._event = torch.cuda.Event(enable_timing=False, blocking=False, interprocess=True)
        self._handle = None

    def record(self, stream=None) -> bytes:
        """Records the event on `stream` (default: the current stream); returns its IPC handle.
        The handle is the same every step, so it is exported once."""
        torch = _torch()
        self._event.record(stream or torch.cuda.current_stream())
        if self._handle is None:
            self._handle = bytes(self._event.ipc_handle())
        return self._handle


_CU_STREAM_WAIT_VALUE_GEQ = 0x0
_libcuda = None


def _stream_wait_value32():
    """The driver's cuStreamWaitValue32 (PyTorch does not expose it)."""
    global _libcuda
    if _libcuda is None:
        _libcuda = ctypes.CDLL("libcuda.so.1")
        for name in ("cuStreamWaitValue32_v2", "cuStreamWaitValue32"):
            fn = getattr(_libcuda, name, None)
            if fn is not None:
                fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
                fn.restype = ctypes.c_int
                _libcuda.wait_value32 = fn
                break
        else:  # pragma: no cover - every CUDA 11.7+ driver has it
            raise OSError("this CUDA driver has no cuStreamWaitValue32")
    return _libcuda.wait_value32


class TokenOutput:
    """Where samplerd writes a step's tokens in this worker's GPU memory (StepOutput): one
    int32 tensor registered for output, holding `token_ids` [max_requests, tokens_per_request],
    `num_accepted` [max_requests] and a done word. Each step:

        output = samplerd.cuda.TokenOutput(client, "tokens", max_requests=64)
        request = client.build_batch(logits, "decode", rows, ..., output=output.next(B))
        channel.send(request)
        output.wait()                         # the current stream waits on the device
        next_ids = output.token_ids[:B, 0]    # the next forward's input, never on the host
        ... enqueue the forward, record its ReadyEvent ...
        result = channel.receive()            # step N's results, one forward later

    next() numbers the steps; wait() makes a stream wait (cuStreamWaitValue32, GEQ) until
    samplerd wrote that step's tokens: valid even when called before samplerd received the step.
    A step that fails as a whole writes nothing: release() then frees the wait from here."""

    def __init__(self, client, name: str, max_requests: int, tokens_per_request: int = 1,
                 device=None):
        torch = _torch()
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.max_requests = max_requests
        self.tokens_per_request = tokens_per_request
        n = max_requests * tokens_per_request
        # Token ids, accept counts, then the done word in a 128-byte line of its own.
        self._done_at = ((n + max_requests + 31) // 32) * 32
        self._storage = torch.zeros(self._done_at + 32, dtype=torch.int32, device=device)
        self.token_ids = self._storage[:n].view(max_requests, tokens_per_request)
        self.num_accepted = self._storage[n:n + max_requests]
        self._done = self._storage[self._done_at:self._done_at + 1]
        self.region = client.register_cuda_tensor(name, self._storage, output=True)
        self.value = 0

    def next(self, num_requests: int) -> "pb.StepOutput":
        """The StepOutput of the next step (its requests must fit: num_requests <= max)."""
        if num_requests > self.max_requests:
            raise ValueError(f"{num_requests} requests exceed the output's {self.max_requests}")
        self.value = (self.value + 1) & 0xFFFFFFFF or 1
        name, base = self.region.name, self.region.base_offset
        return pb.StepOutput(
            token_ids=pb.BufferSlice(name=name, byte_offset=base),
            tokens_per_request=self.tokens_per_request,
            num_accepted=pb.BufferSlice(
                name=name, byte_offset=base + 4 * self.max_requests * self.tokens_per_request),
            done_word=pb.BufferSlice(name=name, byte_offset=base + 4 * self._done_at),
            done_value=self.value)

    def wait(self, stream=None):
        """Makes `stream` (default: the current one) wait until samplerd wrote step next()'s
        tokens."""
        torch = _torch()
        stream = stream or torch.cuda.current_stream()
        error = _stream_wait_value32()(stream.cuda_stream, self._done.data_ptr(), self.value,
                                       _CU_STREAM_WAIT_VALUE_GEQ)
        if error != 0:
            raise RuntimeError(f"cuStreamWaitValue32 failed: CUDA driver error {error}")

    def release(self):
        """Sets the done word from this side (after a step failed as a whole), so a stream that
        waits on it goes on; its token ids are then last step's."""
        torch = _torch()
        side = torch.cuda.Stream(device=self._storage.device)
        with torch.cuda.stream(side):
            self._done.fill_(self.value if self.value < 2**31 else self.value - 2**32)
        side.synchronize()
