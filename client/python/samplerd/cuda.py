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
from dataclasses import dataclass


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
