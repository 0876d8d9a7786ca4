"""The follower side of a context-parallel group, for PyTorch workers: join the group samplerd
created (CreateGroup's nccl_unique_id), then each step optionally send logits to samplerd and
receive the step's packed results by NCCL broadcast. Followers never speak gRPC.

NCCL is reached through ctypes over the libnccl that PyTorch already loads (its nvidia-nccl
wheel, or SAMPLERD_NCCL_LIBRARY): torch.distributed cannot join a communicator from a raw
ncclUniqueId (it makes its own through a TCPStore), CuPy's binding would add a dependency a
PyTorch worker does not have, and the half-dozen calls needed are stable C API.

    follower = GroupFollower(unique_id, world_size=2, rank=1, device=1, max_step_tokens=256)
    while True:
        follower.send_logits(logits)        # only for steps that read this rank's logits
        step = follower.receive_step()
        if step.closing:
            break
        step.requests[0].token_ids          # numpy int32

Every wait is bounded (join_timeout, op_timeout seconds); a timeout aborts the communicator
and raises SamplerError (DEADLINE_EXCEEDED).
"""
import ctypes
import glob
import os
import threading
import time
from dataclasses import dataclass, field
from typing import List

import grpc
import numpy as np

from .errors import SamplerError

MAGIC, VERSION, HEADER_WORDS, REQUEST_WORDS = 0x50474453, 1, 8, 3
_NCCL_UINT8, _NCCL_INT32 = 1, 2


def packet_words(max_step_tokens: int) -> int:
    """Words of a group's packet (sampler/group_packet.h): header, then room for
    max_step_tokens requests (3 words each) and max_step_tokens tokens."""
    return HEADER_WORDS + max_step_tokens * (REQUEST_WORDS + 1)


@dataclass
class PacketRequest:
    status_code: int
    num_accepted: int
    token_ids: np.ndarray


@dataclass
class FollowerStep:
    step_id: int
    status_code: int                 # non-zero: the driver's step failed as a whole
    closing: bool                    # the group ended (DestroyGroup or samplerd shutdown)
    requests: List[PacketRequest] = field(default_factory=list)


def unpack(words: np.ndarray) -> FollowerStep:
    """A packet (int32 words, layout version 1) as a FollowerStep."""
    w = np.asarray(words, dtype=np.int32)
    if w.size < HEADER_WORDS or w[0] != MAGIC:
        raise ValueError("not a samplerd group packet")
    if w[1] != VERSION:
        raise ValueError(f"group packet layout version {w[1]}; this client reads {VERSION}")
    step_id = int(np.uint32(w[2])) | (int(np.uint32(w[3])) << 32)
    n_req, n_tok = int(w[5]), int(w[6])
    if n_req < 0 or n_tok < 0 or HEADER_WORDS + n_req * REQUEST_WORDS + n_tok > w.size:
        raise ValueError("group packet counts exceed its size")
    entries = w[HEADER_WORDS:HEADER_WORDS + n_req * REQUEST_WORDS].reshape(n_req, REQUEST_WORDS)
    token = HEADER_WORDS + n_req * REQUEST_WORDS
    end = token + n_tok
    requests = []
    for code, accepted, n in entries:
        if n < 0 or token + n > end:
            raise ValueError("group packet token counts exceed its total")
        requests.append(PacketRequest(int(code), int(accepted), w[token:token + n].copy()))
        token += int(n)
    if token != end:
        raise ValueError("group packet token counts do not add up")
    return FollowerStep(step_id, int(w[4]), bool(w[7] & 1), requests)


class _UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def _load_nccl():
    import torch  # noqa: F401  (loads PyTorch's libnccl first, so the soname resolves to it)

    candidates = [os.environ.get("SAMPLERD_NCCL_LIBRARY"), "libnccl.so.2"]
    try:
        import nvidia.nccl

        candidates += glob.glob(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so*"))
    except ImportError:
        pass
    for name in filter(None, candidates):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        lib.ncclGetErrorString.restype = ctypes.c_char_p
        return lib
    raise SamplerError(grpc.StatusCode.FAILED_PRECONDITION,
                       "libnccl.so.2 not found: install PyTorch with CUDA, or set SAMPLERD_NCCL_LIBRARY")


def new_unique_id() -> bytes:
    """A fresh ncclUniqueId (the calling process hosts the bootstrap, i.e. is rank 0). For
    tests: in a real group samplerd makes it (CreateGroup)."""
    nccl = _load_nccl()
    uid = _UniqueId()
    rc = nccl.ncclGetUniqueId(ctypes.byref(uid))
    if rc != 0:
        raise SamplerError(grpc.StatusCode.UNAVAILABLE, nccl.ncclGetErrorString(rc).decode())
    return ctypes.string_at(ctypes.addressof(uid), 128)  # .internal would stop at a NUL


class _Communicator:
    """One rank's NCCL communicator on its own CUDA stream, through ctypes: init (bounded),
    broadcast, send, recv, each waited for with a deadline (then aborted)."""

    def __init__(self, unique_id: bytes, world_size: int, rank: int, device: int,
                 join_timeout: float, op_timeout: float):
        import torch

        if len(unique_id) != 128:
            raise ValueError("unique_id: CreateGroupResponse.nccl_unique_id (128 bytes)")
        self._torch = torch
        self._nccl = _load_nccl()
        self.device = torch.device("cuda", device)
        self.op_timeout = op_timeout
        self._stream = torch.cuda.Stream(self.device)
        self._comm = ctypes.c_void_p()
        uid = _UniqueId()
        ctypes.memmove(ctypes.addressof(uid), unique_id, 128)
        result = {}

        # ncclCommInitRank blocks until every rank joined: run it in a thread and bound the
        # wait (the thread is left behind only if the group never completes).
        def init():
            torch.cuda.set_device(self.device)
            result["rc"] = self._nccl.ncclCommInitRank(ctypes.byref(self._comm), world_size, uid, rank)

        thread = threading.Thread(target=init, daemon=True)
        thread.start()
        thread.join(join_timeout)
        if thread.is_alive():
            raise SamplerError(grpc.StatusCode.DEADLINE_EXCEEDED,
                               f"joining the group: not every rank joined within {join_timeout} s")
        self._check(result["rc"], "ncclCommInitRank")

    def _check(self, rc: int, what: str):
        if rc != 0:
            raise SamplerError(grpc.StatusCode.UNAVAILABLE,
                               f"{what}: {self._nccl.ncclGetErrorString(rc).decode()}")

    def _live(self):
        if self._comm is None:
            raise SamplerError(grpc.StatusCode.UNAVAILABLE, "the communicator was aborted")
        return self._comm

    def _args(self, tensor):
        return ctypes.c_void_p(tensor.data_ptr()), ctypes.c_void_p(self._stream.cuda_stream)

    def broadcast(self, words, root: int):
        ptr, stream = self._args(words)
        self._check(self._nccl.ncclBroadcast(ptr, ptr, ctypes.c_size_t(words.numel()), _NCCL_INT32,
                                             root, self._live(), stream), "ncclBroadcast")

    def send(self, tensor, peer: int):
        ptr, stream = self._args(tensor)
        self._stream.wait_stream(self._torch.cuda.current_stream(self.device))
        self._check(self._nccl.ncclSend(ptr, ctypes.c_size_t(tensor.numel() * tensor.element_size()),
                                        _NCCL_UINT8, peer, self._live(), stream), "ncclSend")

    def recv(self, tensor, peer: int):
        ptr, stream = self._args(tensor)
        self._check(self._nccl.ncclRecv(ptr, ctypes.c_size_t(tensor.numel() * tensor.element_size()),
                                        _NCCL_UINT8, peer, self._live(), stream), "ncclRecv")

    def group_start(self):
        self._check(self._nccl.ncclGroupStart(), "ncclGroupStart")

    def group_end(self):
        self._check(self._nccl.ncclGroupEnd(), "ncclGroupEnd")

    def wait(self, what: str):
        """Waits for the stream's NCCL work, polling NCCL's asynchronous error; aborts and
        raises after op_timeout."""
        event = self._torch.cuda.Event()
        event.record(self._stream)
        deadline = time.monotonic() + self.op_timeout
        while not event.query():
            state = ctypes.c_int(0)
            self._nccl.ncclCommGetAsyncError(self._live(), ctypes.byref(state))
            if state.value not in (0, 7):  # ncclSuccess, ncclInProgress
                self.abort()
                self._check(state.value, what)
            if time.monotonic() > deadline:
                self.abort()
                raise SamplerError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                   f"{what} not done after {self.op_timeout} s: aborted")
            time.sleep(20e-6)

    def abort(self):
        if self._comm is not None:
            self._nccl.ncclCommAbort(self._comm)
            self._comm = None

    def close(self):
        if self._comm is not None:
            self._nccl.ncclCommDestroy(self._comm)
            self._comm = None


class GroupFollower:
    """Rank `rank` (1 .. world_size - 1) of a group; `device` is this rank's CUDA device."""

    def __init__(self, unique_id: bytes, world_size: int, rank: int, device: int,
                 max_step_tokens: int, join_timeout: float = 60.0, op_timeout: float = 30.0):
        import torch

        if not 1 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside [1, {world_size - 1}]")
        self._comm = _Communicator(unique_id, world_size, rank, device, join_timeout, op_timeout)
        self._packet = torch.zeros(packet_words(max_step_tokens), dtype=torch.int32,
                                   device=self._comm.device)

    def receive_step_to(self, words):
        """Receives the next packet into `words` (a CUDA int32 tensor of packet_words()) and
        leaves it there (for workers that consume the tokens on the GPU)."""
        self._comm.broadcast(words, root=0)
        self._comm.wait("receiving the step's results")

    def receive_step(self) -> FollowerStep:
        """The next step's results (blocks until samplerd broadcasts them)."""
        self.receive_step_to(self._packet)
        return unpack(self._packet.cpu().numpy())

    def send_logits(self, logits):
        """Sends a contiguous CUDA tensor to samplerd, for a step whose Tensor.nccl names this
        rank (rows, cols and dtype as that Tensor says), after the current stream's work."""
        if not logits.is_cuda or not logits.is_contiguous():
            raise ValueError("send_logits: a contiguous CUDA tensor")
        self._comm.send(logits, peer=0)
        self._comm.wait("sending logits")

    def packet_words(self) -> int:
        return self._packet.numel()

    def abort(self):
        """Stops the communicator (its peers' operations with this rank fail)."""
        self._comm.abort()

    def close(self):
        self._comm.close()
