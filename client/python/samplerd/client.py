"""SamplerClient (blocking) and AsyncSamplerClient (asyncio): samplerd's rpcs, with steps built
from plain values (step.build_step) and answers as numpy arrays (results.StepResult).

Every rpc failure raises SamplerError carrying the grpc.StatusCode. A step-level fault on a
stream (samplerd answers it with `error` set and keeps the stream open) raises SamplerError
from that step; the stream stays usable. A failed request inside a successful step does not
raise until its fields are read (RequestResult), since the step's other results are valid.
"""
import asyncio
import itertools
import queue
import secrets
import threading
from typing import List, Optional, Sequence

import grpc

from ._proto import SERVICE, pb
from .cuda import CudaRegion
from .errors import SamplerError, status_code
from .results import StepResult
from .shm import ShmRegion
from .step import Request, build_step

_MIB = 1 << 20
HEALTH_STATUS = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}

# name -> response class of each unary rpc.
_UNARY = {
    "Sample": "SampleResponse",
    "RegisterBuffer": "RegisterBufferResponse",
    "UnregisterBuffer": "UnregisterBufferResponse",
    "ListBuffers": "ListBuffersResponse",
    "GetServerInfo": "GetServerInfoResponse",
    "Release": "ReleaseResponse",
    "KeepAlive": "KeepAliveResponse",
    "CreateGroup": "CreateGroupResponse",
    "DestroyGroup": "DestroyGroupResponse",
}


def _health_request(service: str) -> bytes:
    """grpc.health.v1.HealthCheckRequest {string service = 1}, encoded by hand so the client
    needs no health package. Short names only (the length is one varint byte)."""
    data = service.encode()
    if len(data) > 127:
        raise ValueError("health service name too long")
    return (b"\x0a" + bytes([len(data)]) + data) if data else b""


def _health_status(data: bytes) -> str:
    """grpc.health.v1.HealthCheckResponse {ServingStatus status = 1} -> its name."""
    value = data[1] if len(data) >= 2 and data[0] == 0x08 else 0
    return HEALTH_STATUS.get(value, str(value))


def _channel_options(max_message_bytes: int):
    return [("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes)]


def _check_step(msg) -> StepResult:
    if msg.HasField("error") and msg.error.code != 0:
        raise SamplerError(status_code(msg.error.code), msg.error.message)
    return StepResult(msg)


def _shm_registration(region: ShmRegion, name: Optional[str]):
    return pb.RegisterBufferRequest(name=name or region.name, kind=pb.HOST_SHM,
                                    shm_name=region.name, byte_size=region.byte_size)


def _cuda_registration(region: CudaRegion):
    return pb.RegisterBufferRequest(name=region.name, kind=pb.CUDA_IPC,
                                    cuda_ipc_handle=region.handle, device_id=region.device_id,
                                    byte_size=region.byte_size)


class _Base:
    def __init__(self, client_id: Optional[str], timeout: Optional[float]):
        # samplerd keys its draft pool by client id, and the client's registrations belong to
        # it: a worker that reconnects under the same id finds its drafts and regions again.
        # Without one, a random id (so that every call of this client is one owner).
        self.client_id = client_id or secrets.token_hex(16)
        self._metadata = (("samplerd-client-id", self.client_id),)
        self._timeout = timeout
        self._step_ids = itertools.count(1)

    def _bind(self, channel):
        """The rpcs' callables on `channel` (grpc and grpc.aio channels have the same API)."""
        self._channel = channel
        self._rpcs = {
            name: channel.unary_unary(f"/{SERVICE}/{name}",
                                      request_serializer=lambda m: m.SerializeToString(),
                                      response_deserializer=getattr(pb, resp).FromString)
            for name, resp in _UNARY.items()}
        self._stream = channel.stream_stream(
            f"/{SERVICE}/SampleStream", request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=pb.SampleResponse.FromString)
        self._health = channel.unary_unary("/grpc.health.v1.Health/Check")

    def build(self, logits, requests: Sequence[Request], step_id: Optional[int] = None, **kw):
        """A SampleRequest (step ids count from 1 when not given)."""
        return build_step(logits, requests,
                          step_id=next(self._step_ids) if step_id is None else step_id, **kw)


class SamplerClient(_Base):
    """A blocking client. `target` is "host:port" or "unix:/path"."""

    def __init__(self, target: str, *, client_id: Optional[str] = None,
                 max_message_bytes: int = 256 * _MIB, timeout: Optional[float] = None,
                 channel: Optional[grpc.Channel] = None):
        super().__init__(client_id, timeout)
        self._bind(channel or grpc.insecure_channel(target, _channel_options(max_message_bytes)))

    def _call(self, name, request):
        try:
            return self._rpcs[name](request, timeout=self._timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise SamplerError.from_rpc_error(e) from None

    def wait_ready(self, timeout: float = 30.0):
        """Blocks until the channel connects (raises SamplerError UNAVAILABLE on timeout)."""
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise SamplerError(grpc.StatusCode.UNAVAILABLE, "samplerd not reachable") from None

    def sample(self, logits, requests: Sequence[Request], **kw) -> StepResult:
        """One step (unary). kw: step_id, vocab_size, force_top_n, compute_sum_smaller_probs."""
        return self.sample_request(self.build(logits, requests, **kw))

    def sample_request(self, request) -> StepResult:
        return _check_step(self._call("Sample", request))

    def stream(self) -> "StepStream":
        """A SampleStream step loop (cheaper per step than unary calls)."""
        return StepStream(self)

    def register_shm(self, region: ShmRegion, name: Optional[str] = None) -> str:
        """Registers `region` (as `name`, default its shm name), then unlinks its name from
        /dev/shm: samplerd has mapped it, the memory lives in the two mappings, and a crash
        leaves no name behind. The registration is this client's: samplerd keeps it while the
        client is alive (its calls, and the keep-alive it sends by itself every lease / 3 from
        its first registration on) and releases it when the client is gone."""
        self._call("RegisterBuffer", _shm_registration(region, name))
        region.unlink()
        self._start_keepalive()
        return name or region.name

    def register_cuda_tensor(self, name: str, tensor) -> CudaRegion:
        """Registers a CUDA tensor's storage as a CUDA_IPC region; send views of it with
        CudaLogits(region, view, ready_event). Kept alive as register_shm's region is."""
        region = CudaRegion.from_tensor(name, tensor)
        self._call("RegisterBuffer", _cuda_registration(region))
        self._start_keepalive()
        return region

    def keep_alive(self):
        """Renews this client's registration lease now; returns the server's KeepAliveResponse."""
        return self._call("KeepAlive", pb.KeepAliveRequest())

    def _start_keepalive(self):
        if getattr(self, "_keepalive", None) is not None:
            return
        self._keepalive_stop = threading.Event()

        def run():
            period = 1.0
            while not self._keepalive_stop.is_set():
                try:
                    lease_ms = self._rpcs["KeepAlive"](pb.KeepAliveRequest(), timeout=2.0,
                                                       metadata=self._metadata).lease_ms
                    period = max(0.05, lease_ms / 3000.0) if lease_ms > 0 else 10.0
                except grpc.RpcError:
                    pass  # the server is away for now; the next tick tries again
                self._keepalive_stop.wait(period)

        self._keepalive = threading.Thread(target=run, name="samplerd-keepalive", daemon=True)
        self._keepalive.start()

    def unregister(self, name: str):
        self._call("UnregisterBuffer", pb.UnregisterBufferRequest(name=name))

    def list_buffers(self) -> List[object]:
        return list(self._call("ListBuffers", pb.ListBuffersRequest()).buffers)

    def server_info(self):
        return self._call("GetServerInfo", pb.GetServerInfoRequest())

    def release(self, request_ids: Sequence[str]) -> int:
        """Drops finished requests' drafts from the server's pool; returns the rows freed."""
        return self._call("Release", pb.ReleaseRequest(request_ids=list(request_ids))).released_rows

    def create_group(self, world_size: int, max_step_tokens: int, device_id: int = 0,
                     join_timeout_ms: int = 0, op_timeout_ms: int = 0, max_logits_bytes: int = 0):
        """A context-parallel group (CUDA backend): samplerd is rank 0; hand the response's
        nccl_unique_id to the followers (samplerd.follower.GroupFollower). Steps name it with
        build(..., group_id=response.group_id)."""
        return self._call("CreateGroup", pb.CreateGroupRequest(
            world_size=world_size, max_step_tokens=max_step_tokens, device_id=device_id,
            join_timeout_ms=join_timeout_ms, op_timeout_ms=op_timeout_ms,
            max_logits_bytes=max_logits_bytes))

    def destroy_group(self, group_id: str):
        """Ends a group (its followers receive a closing packet)."""
        self._call("DestroyGroup", pb.DestroyGroupRequest(group_id=group_id))

    def groups(self) -> List[object]:
        """The groups and their state (GetServerInfo)."""
        return list(self.server_info().groups)

    def health(self, service: str = "") -> str:
        """grpc.health.v1 Check: "SERVING", "NOT_SERVING" (draining), ..."""
        try:
            return _health_status(self._health(_health_request(service), timeout=self._timeout))
        except grpc.RpcError as e:
            raise SamplerError.from_rpc_error(e) from None

    def close(self):
        if getattr(self, "_keepalive", None) is not None:
            self._keepalive_stop.set()
            self._keepalive.join()
            self._keepalive = None
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


_END = object()


class StepStream:
    """One SampleStream: `step()` sends a step and returns its answer; `send()`/`recv()` let a
    worker keep several steps in flight (answers come back in order)."""

    def __init__(self, client: SamplerClient):
        self._client = client
        self._queue: "queue.Queue" = queue.Queue()
        self._responses = client._stream(iter(self._queue.get, _END), metadata=client._metadata)
        self._closed = False

    def send(self, request):
        if self._closed:
            raise SamplerError(grpc.StatusCode.CANCELLED, "the stream is closed")
        self._queue.put(request)

    def recv(self) -> StepResult:
        try:
            return _check_step(next(self._responses))
        except grpc.RpcError as e:
            raise SamplerError.from_rpc_error(e) from None
        except StopIteration:
            raise SamplerError(grpc.StatusCode.UNAVAILABLE, "the stream ended") from None

    def step(self, logits, requests: Sequence[Request], **kw) -> StepResult:
        self.send(self._client.build(logits, requests, **kw))
        return self.recv()

    def close(self):
        """Half-closes the stream and waits for the server to end it."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_END)
        try:
            for _ in self._responses:
                pass
        except grpc.RpcError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class AsyncSamplerClient(_Base):
    """The asyncio client (grpc.aio); the same methods as SamplerClient, awaitable."""

    def __init__(self, target: str, *, client_id: Optional[str] = None,
                 max_message_bytes: int = 256 * _MIB, timeout: Optional[float] = None):
        super().__init__(client_id, timeout)
        self._bind(grpc.aio.insecure_channel(target, _channel_options(max_message_bytes)))

    async def _call(self, name, request):
        try:
            return await self._rpcs[name](request, timeout=self._timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise SamplerError.from_rpc_error(e) from None

    async def sample(self, logits, requests: Sequence[Request], **kw) -> StepResult:
        return await self.sample_request(self.build(logits, requests, **kw))

    async def sample_request(self, request) -> StepResult:
        return _check_step(await self._call("Sample", request))

    def stream(self) -> "AsyncStepStream":
        return AsyncStepStream(self)

    async def register_shm(self, region: ShmRegion, name: Optional[str] = None) -> str:
        """As SamplerClient.register_shm (the keep-alive is a task on this event loop)."""
        await self._call("RegisterBuffer", _shm_registration(region, name))
        region.unlink()
        self._start_keepalive()
        return name or region.name

    async def register_cuda_tensor(self, name: str, tensor) -> CudaRegion:
        region = CudaRegion.from_tensor(name, tensor)
        await self._call("RegisterBuffer", _cuda_registration(region))
        self._start_keepalive()
        return region

    async def keep_alive(self):
        return await self._call("KeepAlive", pb.KeepAliveRequest())

    def _start_keepalive(self):
        if getattr(self, "_keepalive", None) is not None:
            return

        async def run():
            period = 1.0
            while True:
                try:
                    lease_ms = (await self._rpcs["KeepAlive"](
                        pb.KeepAliveRequest(), timeout=2.0, metadata=self._metadata)).lease_ms
                    period = max(0.05, lease_ms / 3000.0) if lease_ms > 0 else 10.0
                except grpc.RpcError:
                    pass
                await asyncio.sleep(period)

        self._keepalive = asyncio.get_running_loop().create_task(run())

    async def unregister(self, name: str):
        await self._call("UnregisterBuffer", pb.UnregisterBufferRequest(name=name))

    async def list_buffers(self) -> List[object]:
        return list((await self._call("ListBuffers", pb.ListBuffersRequest())).buffers)

    async def server_info(self):
        return await self._call("GetServerInfo", pb.GetServerInfoRequest())

    async def groups(self) -> List[object]:
        return list((await self.server_info()).groups)

    async def create_group(self, world_size: int, max_step_tokens: int, device_id: int = 0,
                           join_timeout_ms: int = 0, op_timeout_ms: int = 0,
                           max_logits_bytes: int = 0):
        return await self._call("CreateGroup", pb.CreateGroupRequest(
            world_size=world_size, max_step_tokens=max_step_tokens, device_id=device_id,
            join_timeout_ms=join_timeout_ms, op_timeout_ms=op_timeout_ms,
            max_logits_bytes=max_logits_bytes))

    async def destroy_group(self, group_id: str):
        await self._call("DestroyGroup", pb.DestroyGroupRequest(group_id=group_id))

    async def release(self, request_ids: Sequence[str]) -> int:
        resp = await self._call("Release", pb.ReleaseRequest(request_ids=list(request_ids)))
        return resp.released_rows

    async def health(self, service: str = "") -> str:
        try:
            return _health_status(await self._health(_health_request(service),
                                                     timeout=self._timeout))
        except grpc.RpcError as e:
            raise SamplerError.from_rpc_error(e) from None

    async def close(self):
        if getattr(self, "_keepalive", None) is not None:
            self._keepalive.cancel()
            try:
                await self._keepalive
            except asyncio.CancelledError:
                pass
            self._keepalive = None
        await self._channel.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()


class AsyncStepStream:
    """An asyncio SampleStream: `await step(...)`, or `send()`/`recv()` to pipeline."""

    def __init__(self, client: AsyncSamplerClient):
        self._client = client
        self._call = client._stream(metadata=client._metadata)

    async def send(self, request):
        try:
            await self._call.write(request)
        except grpc.RpcError as e:
            raise SamplerError.from_rpc_error(e) from None

    async def recv(self) -> StepResult:
        try:
            msg = await self._call.read()
        except grpc.RpcError as e:
            raise SamplerError.from_rpc_error(e) from None
        if msg is grpc.aio.EOF:
            raise SamplerError(grpc.StatusCode.UNAVAILABLE, "the stream ended")
        return _check_step(msg)

    async def step(self, logits, requests: Sequence[Request], **kw) -> StepResult:
        await self.send(self._client.build(logits, requests, **kw))
        return await self.recv()

    async def close(self):
        await self._call.done_writing()
        while await self._call.read() is not grpc.aio.EOF:
            pass

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()
