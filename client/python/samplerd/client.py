"""SamplerClient (blocking) and AsyncSamplerClient (asyncio): samplerd's rpcs, with steps built
from plain values (step.build_step) and answers as numpy arrays (results.StepResult).

Every rpc failure raises SamplerError carrying the grpc.StatusCode. A step-level fault on a
stream (samplerd answers it with `error` set and keeps the stream open) raises SamplerError
from that step; the stream stays usable. A failed request inside a successful step does not
raise until its fields are read (RequestResult), since the step's other results are valid.

A samplerd restart under a live client (a sidecar restart, a rollout) is survived without the
caller's help, as the C++ client does: a step that finds samplerd gone waits for it (up to
`reconnect_timeout` seconds; 0 turns recovery off), the client registers its regions again
(an shm region moves to a fresh name: ShmRegion.relink) and resends, on a new stream, every
step that had no answer. A resent step's answer is the one the lost one would have been;
what samplerd held between steps (pooled drafts) is lost, and a request that needs it fails
alone with the pool's error.
"""
import asyncio
import collections
import itertools
import queue
import secrets
import threading
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence

import grpc

from ._proto import SERVICE, pb
from .channel import AsyncStepChannel, StepChannel
from .cuda import CudaRegion
from .errors import SamplerError, status_code
from .results import StepResult, check_step
from .shm import ShmRegion
from .step import Request, build_batch, build_step

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
    "OpenStepChannel": "OpenStepChannelResponse",
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
    # Reconnect backoff capped at 1 s (gRPC's default grows to 120 s): a restarted samplerd is
    # found within a second of coming back. Not grpc.min_reconnect_backoff_ms: gRPC takes it as
    # the least time a connection attempt is given (20 s by default), and at 100 ms a loaded
    # host's connections failed before the server's SETTINGS frame arrived.
    return [("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000)]


@dataclass(frozen=True)
class TLS:
    """TLS to a samplerd serving --tls_cert_file. `ca_file`: the CA bundle (PEM) that verifies
    samplerd's certificate (None: gRPC's default roots); `cert_file` and `key_file`: this
    client's certificate and key, for mutual TLS; `server_name`: the name samplerd's certificate
    carries when it is not the target's host."""

    ca_file: Optional[str] = None
    cert_file: Optional[str] = None
    key_file: Optional[str] = None
    server_name: Optional[str] = None

    def credentials(self):
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("TLS: a client certificate needs its key (cert_file and key_file)")

        def read(path):
            if path is None:
                return None
            with open(path, "rb") as f:
                return f.read()

        return grpc.ssl_channel_credentials(read(self.ca_file), read(self.key_file),
                                            read(self.cert_file))

    def options(self):
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


def _open_channel(module, target: str, max_message_bytes: int, tls: Optional[TLS]):
    """A grpc (or grpc.aio) channel to `target`, plaintext or TLS."""
    options = _channel_options(max_message_bytes)
    if tls is None:
        return module.insecure_channel(target, options)
    return module.secure_channel(target, tls.credentials(), options + tls.options())


def _shm_registration(region: ShmRegion, name: Optional[str]):
    return pb.RegisterBufferRequest(name=name or region.name, kind=pb.HOST_SHM,
                                    shm_name=region.name, byte_size=region.byte_size)


def _cuda_registration(region: CudaRegion, output: bool = False):
    return pb.RegisterBufferRequest(name=region.name, kind=pb.CUDA_IPC,
                                    cuda_ipc_handle=region.handle, device_id=region.device_id,
                                    byte_size=region.byte_size, output=output)


def _name_wait(error: SamplerError, deadline: float) -> Optional[float]:
    """How long to wait before registering again after `error`, or None to raise it: an
    ALREADY_EXISTS whose holder samplerd keeps only for its lease (retry_after), while the
    deadline allows."""
    if error.code != grpc.StatusCode.ALREADY_EXISTS or error.retry_after is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        return None
    return min(error.retry_after + 0.02, left)


_SHUTTING_DOWN = "samplerd is shutting down"  # a draining samplerd's refusal of a step


def _advance(flow, pending):
    """One move of a _Base flow: sends it pending = [reply, error] (and empties the list),
    returns (True, its result) once it returned, else (False, its next op); an exception it
    raises propagates. What both front ends' _drive share."""
    reply, error = pending
    pending[0] = pending[1] = None
    try:
        return False, (flow.throw(error) if error is not None else flow.send(reply))
    except StopIteration as done:
        return True, done.value
    except BaseException:
        # The exception's traceback holds this frame: without the locals, no cycle keeps the
        # caller's frames (and their numpy views) alive until the gc runs.
        error = reply = flow = None
        raise


class _Base:
    def __init__(self, client_id: Optional[str], timeout: Optional[float],
                 reconnect_timeout: float):
        # samplerd keys its draft pool by client id, and the client's registrations belong to
        # it: a worker that reconnects under the same id finds its drafts and regions again.
        # Without one, a random id (so that every call of this client is one owner).
        self.client_id = client_id or secrets.token_hex(16)
        self._metadata = (("samplerd-client-id", self.client_id),)
        self._timeout = timeout
        self._step_ids = itertools.count(1)
        self._reconnect_timeout = reconnect_timeout
        # What this client registered, to register again with a restarted samplerd: name ->
        # (RegisterBufferRequest, its ShmRegion or None); and the samplerd that holds it.
        self._registrations = {}
        self._server_id = None
        self._register_again = False
        # Guards the three above against the keep-alive thread (SamplerClient); never held
        # across a call.
        self._state_lock = threading.Lock()

    def _should_wait(self, code) -> bool:
        """UNAVAILABLE is samplerd gone (or draining); CANCELLED, on a call this client waits
        on, is samplerd shutting down (gRPC's server cancels the calls it had not started:
        grpc/grpc#41785); NOT_FOUND may be a restarted samplerd that forgot this client's
        regions (asked before resending). Other codes are answers."""
        return self._reconnect_timeout > 0 and code in (grpc.StatusCode.UNAVAILABLE,
                                                        grpc.StatusCode.CANCELLED,
                                                        grpc.StatusCode.NOT_FOUND)

    def _note_alive(self, reply):
        """A KeepAlive answer: a different samplerd, or fewer regions, means it lost them."""
        with self._state_lock:
            if self._registrations and (reply.server_id != self._server_id or
                                        reply.buffers < len(self._registrations)):
                self._register_again = True

    def _note_registered(self, request, region, server_id):
        with self._state_lock:
            if self._registrations and server_id != self._server_id:
                self._register_again = True  # samplerd restarted since the earlier ones
            self._server_id = server_id
            self._registrations[request.name] = (request, region)

    def _lost_registrations(self, listed):
        """The (request, region) pairs samplerd no longer holds for this client."""
        held = {b.name for b in listed.buffers if b.owner == "id:" + self.client_id}
        with self._state_lock:
            return [(req, region) for name, (req, region) in self._registrations.items()
                    if name not in held]

    @staticmethod
    def _moved(request, region):
        """`request` for `region` after moving it to a fresh shm name (its old one is gone)."""
        if region is None:
            return request
        region.relink()
        moved = pb.RegisterBufferRequest()
        moved.CopyFrom(request)
        moved.shm_name = region.name
        return moved

    @staticmethod
    def _again_failed(request, error):
        return SamplerError(error.code, f"registering {request.name!r} again with samplerd: "
                                        f"{error.message}")

    def _registered_again(self, request, region, reply):
        """`request` (for `region`, or None) is registered with the samplerd that sent `reply`."""
        if region is not None:
            region.unlink()  # its fresh name too: the mappings keep the memory
        with self._state_lock:
            self._registrations[request.name] = (request, region)
            self._server_id = reply.server_id

    def _forget(self, name):
        """An unregistered region: not registered again after a restart."""
        with self._state_lock:
            self._registrations.pop(name, None)

    def _refused(self, msg) -> bool:
        """A draining samplerd's refusal of a step, which goes to the next samplerd instead."""
        return (msg.HasField("error") and msg.error.code == grpc.StatusCode.UNAVAILABLE.value[0]
                and _SHUTTING_DOWN in msg.error.message and self._reconnect_timeout > 0)

    def _not_found(self, msg) -> bool:
        return (msg.HasField("error") and msg.error.code == grpc.StatusCode.NOT_FOUND.value[0]
                and self._reconnect_timeout > 0)

    def _gone(self, last_error):
        return SamplerError(grpc.StatusCode.UNAVAILABLE,
                            f"samplerd did not come back within {self._reconnect_timeout} s "
                            f"(reconnect_timeout): {last_error}")

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

    # The client's logic, once for both front ends (issue 48): each flow is a generator that
    # yields what it needs done, and SamplerClient._drive / AsyncSamplerClient._drive do it,
    # blocking or awaiting, and send back the reply (or throw the SamplerError in):
    #   ("call", rpc, request)          a unary rpc
    #   ("keepalive", timeout, wait)    KeepAlive, waiting for the channel when `wait`
    #   ("sleep", seconds)
    #   ("register_again",)             _register_again_if_needed (under the front end's lock)
    def _sample_flow(self, request):
        yield ("register_again",)
        try:
            return check_step((yield ("call", "Sample", request)))
        except SamplerError as e:
            if not self._should_wait(e.code):
                raise
            if e.code == grpc.StatusCode.NOT_FOUND:
                if not (yield from self._lost_flow()):
                    raise
                yield ("register_again",)
            else:
                yield from self._await_server_flow()
        return check_step((yield ("call", "Sample", request)))

    def _await_server_flow(self):
        """Waits up to reconnect_timeout for samplerd to answer, then registers again what it
        lost (raises SamplerError UNAVAILABLE naming reconnect_timeout if it does not come)."""
        deadline = time.monotonic() + self._reconnect_timeout
        while True:
            left = deadline - time.monotonic()
            try:
                reply = yield ("keepalive", max(left, 0.001), True)
                break
            except SamplerError as e:
                # A samplerd still draining answers UNAVAILABLE itself, and a shutting-down
                # gRPC server cancels calls it had not started: wait for the next one.
                if (e.code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
                        or left < 0.05):
                    raise self._gone(e.message) from None
                yield ("sleep", 0.05)
        self._note_alive(reply)
        yield ("register_again",)

    def _lost_flow(self):
        """Whether samplerd lost this client's registrations (asked by a KeepAlive)."""
        try:
            reply = yield ("keepalive", self._timeout, False)
        except SamplerError:
            return False
        self._note_alive(reply)
        return self._register_again

    def _register_again_flow(self):
        """Registers again what samplerd no longer holds (run under the registrations lock)."""
        if not self._register_again:
            return  # another thread or task did it
        listed = yield ("call", "ListBuffers", pb.ListBuffersRequest())
        for request, region in self._lost_registrations(listed):
            request = self._moved(request, region)
            try:
                reply = yield ("call", "RegisterBuffer", request)
            except SamplerError as e:
                raise self._again_failed(request, e) from None
            self._registered_again(request, region, reply)
        self._register_again = False

    def _register_flow(self, request, region):
        yield ("register_again",)
        deadline = time.monotonic() + self._reconnect_timeout
        while True:
            try:
                reply = yield ("call", "RegisterBuffer", request)
                break
            except SamplerError as e:
                wait = _name_wait(e, deadline)
                if wait is None:
                    raise
                yield ("sleep", wait)
        self._note_registered(request, region, reply.server_id)
        self._start_keepalive()

    def build(self, logits, requests: Sequence[Request], step_id: Optional[int] = None, **kw):
        """A SampleRequest (step ids count from 1 when not given)."""
        return build_step(logits, requests,
                          step_id=next(self._step_ids) if step_id is None else step_id, **kw)

    def build_batch(self, logits, kind, rows, step_id: Optional[int] = None, **kw):
        """A SampleRequest of len(rows) requests from arrays (samplerd.build_batch)."""
        return build_batch(logits, kind, rows,
                           step_id=next(self._step_ids) if step_id is None else step_id, **kw)


class SamplerClient(_Base):
    """A blocking client. `target` is "host:port" or "unix:/path"; `tls=samplerd.TLS(...)` for
    a samplerd serving TLS (mutual TLS with cert_file and key_file)."""

    def __init__(self, target: str, *, client_id: Optional[str] = None,
                 max_message_bytes: int = 256 * _MIB, timeout: Optional[float] = None,
                 channel: Optional[grpc.Channel] = None, reconnect_timeout: float = 30.0,
                 tls: Optional[TLS] = None):
        super().__init__(client_id, timeout, reconnect_timeout)
        self._bind(channel or _open_channel(grpc, target, max_message_bytes, tls))
        self._registrations_lock = threading.RLock()

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
        return self._drive(self._sample_flow(request))

    def _drive(self, flow):
        """Runs one of _Base's flows, blocking."""
        pending = [None, None]  # the reply or the SamplerError the flow gets next
        while True:
            done, op = _advance(flow, pending)
            if done:
                return op
            kind = op[0]
            if kind == "call":
                try:
                    pending[0] = self._call(op[1], op[2])
                except SamplerError as e:
                    pending[1] = e
            elif kind == "keepalive":
                try:
                    pending[0] = self._rpcs["KeepAlive"](
                        pb.KeepAliveRequest(), timeout=op[1], metadata=self._metadata,
                        wait_for_ready=op[2])
                except grpc.RpcError as e:
                    pending[1] = SamplerError.from_rpc_error(e)
                    e.__traceback__ = None
            elif kind == "sleep":
                time.sleep(op[1])
            elif kind == "register_again":
                self._register_again_if_needed()

    def _await_server(self):
        self._drive(self._await_server_flow())

    def _registrations_lost(self) -> bool:
        return self._drive(self._lost_flow())

    def _register_again_if_needed(self):
        if not self._register_again:
            return
        with self._registrations_lock:
            self._drive(self._register_again_flow())

    def _register(self, request, region):
        self._drive(self._register_flow(request, region))

    def stream(self) -> "StepStream":
        """A SampleStream step loop (cheaper per step than unary calls)."""
        return StepStream(self)

    def channel(self, capacity_bytes: int = 4 << 20, spin_seconds=None) -> StepChannel:
        """A co-located step channel (samplerd.channel): the same steps and answers as a
        stream's, through shared memory, for a worker on samplerd's host."""
        return StepChannel(self, capacity_bytes, spin_seconds)

    def register_shm(self, region: ShmRegion, name: Optional[str] = None) -> str:
        """Registers `region` (as `name`, default its shm name), then unlinks its name from
        /dev/shm: samplerd has mapped it, the memory lives in the two mappings, and a crash
        leaves no name behind. The registration is this client's: samplerd keeps it while the
        client is alive (its calls, and the keep-alive it sends by itself every lease / 3 from
        its first registration on) and releases it when the client is gone.

        A name held by a client that samplerd keeps only for its lease (a killed worker this
        one replaces) is waited for, at most reconnect_timeout; the same client_id takes its
        own names over at once. A failed registration unlinks the name too."""
        try:
            self._register(_shm_registration(region, name), region)
        finally:
            region.unlink()
        region.buffer_name = name or region.name
        return region.buffer_name

    def register_cuda_tensor(self, name: str, tensor, output: bool = False) -> CudaRegion:
        """Registers a CUDA tensor's storage as a CUDA_IPC region; send views of it with
        CudaLogits(region, view, ready_event). Kept alive as register_shm's region is.
        `output`: steps may also write their tokens into it (samplerd.cuda.TokenOutput)."""
        region = CudaRegion.from_tensor(name, tensor)
        self._register(_cuda_registration(region, output), None)
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
                    reply = self._rpcs["KeepAlive"](pb.KeepAliveRequest(), timeout=2.0,
                                                    metadata=self._metadata)
                    # A restarted samplerd: the next call registers again (on the caller's
                    # thread: relinking an shm region copies it, which must not race the
                    # worker's writes).
                    self._note_alive(reply)
                    lease_ms = reply.lease_ms
                    period = max(0.05, lease_ms / 3000.0) if lease_ms > 0 else 10.0
                except grpc.RpcError:
                    pass  # the server is away for now; the next tick tries again
                self._keepalive_stop.wait(period)

        self._keepalive = threading.Thread(target=run, name="samplerd-keepalive", daemon=True)
        self._keepalive.start()

    def unregister(self, name: str):
        self._call("UnregisterBuffer", pb.UnregisterBufferRequest(name=name))
        self._forget(name)

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
    worker keep several steps in flight (answers come back in order). A stream broken by a
    samplerd restart is resumed (the client's docstring says how)."""

    def __init__(self, client: SamplerClient):
        self._client = client
        self._unanswered = collections.deque()  # sent, not yet answered, in order
        self._closed = False
        self._open()

    def _open(self):
        self._queue: "queue.Queue" = queue.Queue()
        self._responses = self._client._stream(iter(self._queue.get, _END),
                                               metadata=self._client._metadata)

    def _resume(self):
        """Ends the broken stream, waits for samplerd, opens a new stream and resends every
        unanswered step."""
        self._queue.put(_END)
        self._responses.cancel()
        self._client._await_server()
        self._open()
        for request in self._unanswered:
            self._queue.put(request)

    def send(self, request):
        if self._closed:
            raise SamplerError(grpc.StatusCode.CANCELLED, "the stream is closed")
        try:
            self._client._register_again_if_needed()
        except SamplerError as e:
            if not self._client._should_wait(e.code):
                raise
            # samplerd is going or coming back: this call is ended before waiting for the next
            # samplerd (a draining one waits for its open calls), then the stream resumed.
            e.__traceback__ = None
            self._resume()
        self._unanswered.append(request)
        self._queue.put(request)

    def recv(self) -> StepResult:
        # Resumed at most twice per answer: a step that takes samplerd down every time is not
        # resent for ever.
        for resumed in range(3):
            try:
                msg = next(self._responses)
            except grpc.RpcError as e:
                error = SamplerError.from_rpc_error(e)
                # The call is its own exception: its traceback holds the caller's frames (and
                # the numpy views there), in a cycle only the gc would free.
                e.__traceback__ = None
            except StopIteration:
                error = SamplerError(grpc.StatusCode.UNAVAILABLE, "the stream ended")
            else:
                if self._client._refused(msg) or (self._client._not_found(msg) and
                                                  self._client._registrations_lost()):
                    error = SamplerError(grpc.StatusCode.UNAVAILABLE, msg.error.message)
                else:
                    if self._unanswered:
                        self._unanswered.popleft()
                    return check_step(msg)
            if resumed == 2 or not self._client._should_wait(error.code):
                raise error
            self._resume()
        raise AssertionError("unreachable")

    receive = recv  # as the step channel names it

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
                 max_message_bytes: int = 256 * _MIB, timeout: Optional[float] = None,
                 reconnect_timeout: float = 30.0, tls: Optional[TLS] = None):
        super().__init__(client_id, timeout, reconnect_timeout)
        self._bind(_open_channel(grpc.aio, target, max_message_bytes, tls))
        self._registrations_lock = asyncio.Lock()

    async def _call(self, name, request):
        try:
            return await self._rpcs[name](request, timeout=self._timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise SamplerError.from_rpc_error(e) from None

    async def sample(self, logits, requests: Sequence[Request], **kw) -> StepResult:
        return await self.sample_request(self.build(logits, requests, **kw))

    async def sample_request(self, request) -> StepResult:
        return await self._drive(self._sample_flow(request))

    async def _drive(self, flow):
        """Runs one of _Base's flows on the event loop (SamplerClient._drive, awaiting)."""
        pending = [None, None]  # the reply or the SamplerError the flow gets next
        while True:
            done, op = _advance(flow, pending)
            if done:
                return op
            kind = op[0]
            if kind == "call":
                try:
                    pending[0] = await self._call(op[1], op[2])
                except SamplerError as e:
                    pending[1] = e
            elif kind == "keepalive":
                try:
                    pending[0] = await self._rpcs["KeepAlive"](
                        pb.KeepAliveRequest(), timeout=op[1], metadata=self._metadata,
                        wait_for_ready=op[2])
                except grpc.RpcError as e:
                    pending[1] = SamplerError.from_rpc_error(e)
                    e.__traceback__ = None
            elif kind == "sleep":
                await asyncio.sleep(op[1])
            elif kind == "register_again":
                await self._register_again_if_needed()

    async def _await_server(self):
        await self._drive(self._await_server_flow())

    async def _registrations_lost(self) -> bool:
        return await self._drive(self._lost_flow())

    async def _register_again_if_needed(self):
        if not self._register_again:
            return
        async with self._registrations_lock:
            await self._drive(self._register_again_flow())

    async def _register(self, request, region):
        await self._drive(self._register_flow(request, region))

    def stream(self) -> "AsyncStepStream":
        return AsyncStepStream(self)

    async def channel(self, capacity_bytes: int = 4 << 20,
                      spin_seconds=None) -> AsyncStepChannel:
        """As SamplerClient.channel, for asyncio (its wait runs in the default executor)."""
        return await AsyncStepChannel.open(self, capacity_bytes, spin_seconds)

    async def register_shm(self, region: ShmRegion, name: Optional[str] = None) -> str:
        """As SamplerClient.register_shm (the keep-alive is a task on this event loop)."""
        try:
            await self._register(_shm_registration(region, name), region)
        finally:
            region.unlink()
        region.buffer_name = name or region.name
        return region.buffer_name

    async def register_cuda_tensor(self, name: str, tensor, output: bool = False) -> CudaRegion:
        region = CudaRegion.from_tensor(name, tensor)
        await self._register(_cuda_registration(region, output), None)
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
                    reply = await self._rpcs["KeepAlive"](
                        pb.KeepAliveRequest(), timeout=2.0, metadata=self._metadata)
                    self._note_alive(reply)  # the next call registers again if needed
                    lease_ms = reply.lease_ms
                    period = max(0.05, lease_ms / 3000.0) if lease_ms > 0 else 10.0
                except grpc.RpcError:
                    pass
                await asyncio.sleep(period)

        self._keepalive = asyncio.get_running_loop().create_task(run())

    async def unregister(self, name: str):
        await self._call("UnregisterBuffer", pb.UnregisterBufferRequest(name=name))
        self._forget(name)

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
    """An asyncio SampleStream: `await step(...)`, or `send()`/`recv()` to pipeline. Resumed
    after a samplerd restart as StepStream is."""

    def __init__(self, client: AsyncSamplerClient):
        self._client = client
        self._unanswered = collections.deque()
        self._call = client._stream(metadata=client._metadata)
        self._broken = False  # a write failed: the stream is gone, whatever read() says

    async def _resume(self):
        self._call.cancel()
        await self._client._await_server()
        self._call = self._client._stream(metadata=self._client._metadata)
        self._broken = False
        for request in self._unanswered:
            try:
                await self._call.write(request)
            except (grpc.RpcError, asyncio.InvalidStateError):
                self._broken = True  # gone again: the next read resumes once more
                break

    async def send(self, request):
        try:
            await self._client._register_again_if_needed()
        except SamplerError as e:
            if not self._client._should_wait(e.code):
                raise
            e.__traceback__ = None
            await self._resume()  # as StepStream.send: the call ends before the wait
        self._unanswered.append(request)
        try:
            await self._call.write(request)
        except (grpc.RpcError, asyncio.InvalidStateError) as e:
            # Broken: recv() resumes the stream and resends this step with the others (the
            # read then fails with grpc's INTERNAL "Internal error from Core", not UNAVAILABLE).
            self._broken = True
            if self._client._reconnect_timeout <= 0:
                if isinstance(e, grpc.RpcError):
                    raise SamplerError.from_rpc_error(e) from None
                raise SamplerError(grpc.StatusCode.UNAVAILABLE, "the stream ended") from None

    async def recv(self) -> StepResult:
        for resumed in range(3):
            try:
                msg = await self._call.read()
            except grpc.RpcError as e:
                error = SamplerError.from_rpc_error(e)
                if self._broken:
                    error = SamplerError(grpc.StatusCode.UNAVAILABLE,
                                         f"the stream broke while sending: {error.message}")
            else:
                if msg is grpc.aio.EOF:
                    error = SamplerError(grpc.StatusCode.UNAVAILABLE, "the stream ended")
                elif self._client._refused(msg) or (self._client._not_found(msg) and
                                                    await self._client._registrations_lost()):
                    error = SamplerError(grpc.StatusCode.UNAVAILABLE, msg.error.message)
                else:
                    if self._unanswered:
                        self._unanswered.popleft()
                    return check_step(msg)
            if resumed == 2 or not self._client._should_wait(error.code):
                raise error
            await self._resume()
        raise AssertionError("unreachable")

    receive = recv  # as the step channel names it

    async def step(self, logits, requests: Sequence[Request], **kw) -> StepResult:
        await self.send(self._client.build(logits, requests, **kw))
        return await self.recv()

    async def close(self):
        try:
            await self._call.done_writing()
            while await self._call.read() is not grpc.aio.EOF:
                pass
        except (grpc.RpcError, asyncio.InvalidStateError):
            pass  # broken by a samplerd restart while idle: nothing was lost

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()
