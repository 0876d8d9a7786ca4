"""A co-located worker's step channel: its steps through shared memory and a futex instead of
gRPC, for a worker on samplerd's host (a pod's containers share /dev/shm). The layout is the
proto's (OpenStepChannelRequest); samplerd answers every step exactly as SampleStream does, by
the same step pipeline, so the results are bitwise the same. gRPC stays the control plane:
the channel is opened by an rpc and belongs to the client (its keep-alive), like its regions.

    with client.channel() as channel:            # client: a SamplerClient
        step = channel.step(logits, requests)    # as StepStream.step

One step at a time (the channel has one request and one response area); send() and receive()
split a step so the worker works meanwhile (the asynchronous decode loop of issue 46). The wait for an
answer spins briefly, then sleeps in the kernel (futex, the GIL released); while it waits longer
than a second it asks samplerd whether it is still there (KeepAlive), and a samplerd that went
away or restarted fails the step with UNAVAILABLE: the channel does not outlive samplerd (open
a new one; a SampleStream resumes by itself). Linux only (x86-64, aarch64).
"""
import asyncio
import ctypes
import platform
import struct
import time

import grpc

from ._proto import pb
from .errors import SamplerError
from .results import check_step
from .shm import ShmRegion

_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine())
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

_HEADER = 64
_MAGIC, _VERSION = 0x48434453, 1
# Words (u32) of the header, by index.
_REQUEST_SEQ, _RESPONSE_SEQ, _REQUEST_LEN, _RESPONSE_LEN, _STATE, _CAPACITY = 2, 3, 4, 5, 6, 7
_OPEN, _CLOSED_BY_WORKER = 0, 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_POLL = _Timespec(0, 100_000_000)  # each futex wait: 100 ms, then the state is looked at
# The adaptive spin (spin_seconds=None): twice the last step's wait, within these bounds.
_SPIN_MIN, _SPIN_MAX = 500e-6, 5e-3


class StepChannel:
    """A step channel of `capacity_bytes` a direction (a request or a response larger than it
    fails: raise it for many rows with large top-logprob lists). A step's wait polls before it
    sleeps on the futex, so that the wake-up (50-150 us on a host whose cores idle) stays off
    the step's latency; the poll holds the GIL between Python's switch intervals.
    `spin_seconds=None` (the default) polls for twice the last step's wait, within 0.5-5 ms:
    a synchronous loop, whose answer comes a forward and a step after the send (1-3 ms), is
    polled for, as PyTorch's own `.cpu()` spins on the GPU; an asynchronous loop, whose answer
    is usually there when it asks, polls 0.5 ms. A number fixes the poll."""

    def __init__(self, client, capacity_bytes: int = 4 << 20, spin_seconds=None):
        self._prepare(client, capacity_bytes, spin_seconds)
        try:
            reply = client._call("OpenStepChannel", self._open_request())
        except BaseException:
            self._release()
            raise
        self._opened(reply)
        self._keep_alive = lambda: client._call("KeepAlive", pb.KeepAliveRequest())

    def _prepare(self, client, capacity_bytes, spin_seconds):
        """Creates and maps the object and writes its header (before the open rpc)."""
        if _SYS_FUTEX is None:
            raise OSError(f"step channels need Linux on x86-64 or aarch64, not {platform.machine()}")
        self._client = client
        self._capacity = capacity_bytes
        self._spin = spin_seconds
        self._last_wait = 0.0
        self._region = ShmRegion(_HEADER + 2 * capacity_bytes)
        self._map = self._region._map
        self._words = (ctypes.c_uint32 * 16).from_buffer(self._map)
        self._words[0], self._words[1], self._words[_CAPACITY] = _MAGIC, _VERSION, capacity_bytes
        base = ctypes.addressof(self._words)
        self._request_word = ctypes.c_void_p(base + 4 * _REQUEST_SEQ)
        self._response_word = ctypes.c_void_p(base + 4 * _RESPONSE_SEQ)
        self._seq = 0
        self._in_flight = False

    def _open_request(self):
        return pb.OpenStepChannelRequest(shm_name=self._region.name,
                                         capacity_bytes=self._capacity)

    def _opened(self, reply):
        self.channel_id, self._server_id = reply.channel_id, reply.server_id
        self._region.unlink()  # both sides have it mapped: no name left behind by a crash
        self._client._start_keepalive()

    def step(self, logits, requests, **kw):
        """One step (as StepStream.step): its StepResult, or SamplerError for a step-level
        fault (the error samplerd answered with, as on a stream)."""
        return self.step_request(self._client.build(logits, requests, **kw))

    def step_request(self, request):
        self.send(request)
        return self.receive()

    def send(self, request):
        """Sends a step without waiting for its answer (receive() returns it): a worker that
        writes tokens on the device (StepOutput) enqueues its next forward meanwhile. One step
        at a time: a second send before receive() is refused."""
        if self._words is None:
            raise SamplerError(grpc.StatusCode.CANCELLED, "the channel is closed")
        if self._in_flight:
            raise SamplerError(grpc.StatusCode.FAILED_PRECONDITION,
                               "the channel's step is not received yet (one step at a time)")
        data = request.SerializeToString()
        if len(data) > self._capacity:
            raise SamplerError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"the step's {len(data)} bytes exceed the channel's capacity of "
                               f"{self._capacity} (open it with a larger capacity_bytes)")
        self._map[_HEADER:_HEADER + len(data)] = data
        self._words[_REQUEST_LEN] = len(data)
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        self._words[_REQUEST_SEQ] = self._seq
        self._in_flight = True
        _libc.syscall(_SYS_FUTEX, self._request_word, _FUTEX_WAKE, 1, None, None, 0)

    def receive(self):
        """The answer to the step send() sent: a StepResult (a BatchResult for packed
        results), or SamplerError for a step-level fault."""
        if not self._in_flight:
            raise SamplerError(grpc.StatusCode.FAILED_PRECONDITION, "no step was sent")
        self._wait()
        self._in_flight = False
        n = self._words[_RESPONSE_LEN]
        at = _HEADER + self._capacity
        return check_step(pb.SampleResponse.FromString(self._map[at:at + min(n, self._capacity)]))

    def _wait(self):
        words, seq = self._words, self._seq
        start = time.perf_counter()
        end = start + self.spin_budget()
        while words[_RESPONSE_SEQ] != seq and time.perf_counter() < end:
            pass
        try:
            self._sleep_until(seq)
        finally:
            self._last_wait = time.perf_counter() - start

    def spin_budget(self) -> float:
        """How long the next step's wait polls before it sleeps, in seconds."""
        if self._spin is not None:
            return self._spin
        return min(_SPIN_MAX, max(_SPIN_MIN, 2 * self._last_wait))

    def _sleep_until(self, seq):
        words = self._words
        check_at = time.monotonic() + 1.0
        while True:
            current = words[_RESPONSE_SEQ]
            if current == seq:
                return
            if words[_STATE] != _OPEN:
                raise SamplerError(grpc.StatusCode.UNAVAILABLE, "samplerd closed the step channel")
            if time.monotonic() > check_at:
                self._check_server()
                check_at = time.monotonic() + 1.0
            _libc.syscall(_SYS_FUTEX, self._response_word, _FUTEX_WAIT, ctypes.c_uint32(current),
                          ctypes.byref(_POLL), None, 0)

    def _check_server(self):
        try:
            reply = self._keep_alive()
        except SamplerError as e:
            raise SamplerError(grpc.StatusCode.UNAVAILABLE,
                               f"samplerd went away during a channel step: {e}") from None
        if reply.server_id != self._server_id:
            raise SamplerError(grpc.StatusCode.UNAVAILABLE,
                               "samplerd restarted during a channel step (open a new channel)")

    def _release(self):
        self._words = None
        self._map = None
        self._region.close()

    def close(self):
        """Tells samplerd to stop serving the channel and unmaps it."""
        if self._words is None:
            return
        self._words[_STATE] = _CLOSED_BY_WORKER
        _libc.syscall(_SYS_FUTEX, self._request_word, _FUTEX_WAKE, 1, None, None, 0)
        self._release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class AsyncStepChannel:
    """The step channel for asyncio workers (`await AsyncSamplerClient.channel()`): the same
    steps and answers; the wait for an answer runs in a thread of the loop's default executor,
    so the event loop goes on meanwhile.

        async with await client.channel() as channel:
            step = await channel.step(logits, requests)
    """

    def __init__(self, channel: StepChannel):
        self._channel = channel

    @classmethod
    async def open(cls, client, capacity_bytes: int = 4 << 20, spin_seconds=None):
        channel = StepChannel.__new__(StepChannel)
        channel._prepare(client, capacity_bytes, spin_seconds)
        try:
            reply = await client._call("OpenStepChannel", channel._open_request())
        except BaseException:
            channel._release()
            raise
        channel._opened(reply)
        loop = asyncio.get_running_loop()
        # Called from the executor's thread while a step waits: the rpc runs on the loop.
        channel._keep_alive = lambda: asyncio.run_coroutine_threadsafe(
            client._call("KeepAlive", pb.KeepAliveRequest()), loop).result()
        return cls(channel)

    @property
    def channel_id(self) -> str:
        return self._channel.channel_id

    async def step(self, logits, requests, **kw):
        return await self.step_request(self._channel._client.build(logits, requests, **kw))

    async def step_request(self, request):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self._channel.step_request, request)

    def send(self, request):
        self._channel.send(request)

    async def receive(self):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self._channel.receive)

    def close(self):
        self._channel.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        self.close()

