#!/usr/bin/env python3
"""A model worker that shares a PyTorch CUDA tensor with samplerd (GPU machine; a gpu test).

  python3 tests/torch_ipc_worker.py --target=127.0.0.1:PORT --reference=127.0.0.1:PORT2 \
      --descriptors=.device-pack/sampler.desc

The logits pool is one PyTorch CUDA tensor; a step's logits are a view into it at a nonzero
offset. The pool's storage is shared with storage._share_cuda_(): its handle (66 bytes: version
2, type 'c', the cudaIpcMemHandle_t) is registered as a CUDA_IPC region of the storage's size.
Each step the worker first queues a ~20 ms sleep kernel on its stream, then writes new logits
into the view, records an interprocess torch.cuda.Event and sends the step with that event's
IPC handle as ready_event, without synchronising the host: a server that did not wait on the
event would read the previous step's logits and disagree (a negative control, a step sent
without the event, has not been run). Every answer is compared with a samplerd on the
CPU backend (--reference) sent the same logits inline: tokens equal (SPEC 8's boundary band
aside: at most one mismatch in all), processed logprobs within 1e-5. fp32 and bf16 steps,
registered region and one-off cuda_ipc refs. Also: a handle of the expandable-segments form
('e') is refused, naming the setting. Exit status 0 when everything agrees.

Messages are built from the service's FileDescriptorSet (//proto:sampler_descriptor_set), so
no generated Python code is needed on the GPU machine; grpcio calls the methods by name.
"""
import argparse
import sys

import grpc
import torch
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

ROWS, VOCAB, STEPS = 16, 129280, 12


def load_messages(path):
    files = descriptor_pb2.FileDescriptorSet.FromString(open(path, "rb").read())
    pool = descriptor_pool.DescriptorPool()
    for f in files.file:
        pool.Add(f)

    def cls(name):
        return message_factory.GetMessageClass(pool.FindMessageTypeByName("samplerd.v1." + name))

    def enum(name, value):
        return pool.FindEnumTypeByName("samplerd.v1." + name).values_by_name[value].number

    return cls, enum


class Sampler:
    def __init__(self, target, cls):
        channel = grpc.insecure_channel(target, options=[("grpc.max_send_message_length", 1 << 28),
                                                         ("grpc.max_receive_message_length", 1 << 28)])

        def method(name, req, resp):
            return channel.unary_unary("/samplerd.v1.Sampler/" + name,
                                       request_serializer=lambda m: m.SerializeToString(),
                                       response_deserializer=cls(resp).FromString)

        self.sample = method("Sample", "SampleRequest", "SampleResponse")
        self.register = method("RegisterBuffer", "RegisterBufferRequest", "RegisterBufferResponse")
        self.unregister = method("UnregisterBuffer", "UnregisterBufferRequest", "UnregisterBufferResponse")
        self.info = method("GetServerInfo", "GetServerInfoRequest", "GetServerInfoResponse")


def make_step(cls, enum, step_id, dtype):
    req = cls("SampleRequest")()
    req.step_id = step_id
    req.logits.dtype = enum("DType", dtype)
    req.logits.rows = ROWS
    req.logits.cols = VOCAB
    req.inputs.kind = enum("StepKind", "PREFILL")
    req.inputs.vocab_size = VOCAB
    req.inputs.compute_sum_smaller_probs = True
    for r in range(ROWS):
        q = req.inputs.requests.add()
        q.request_id = f"t{r}"
        q.row = r
        q.sample_position = 30 + step_id
        q.params.temperature = 0.7
        q.params.top_p = 0.95
        q.params.top_k = 50
        q.params.top_logprobs = 5
        q.params.seq_seed = 1000 * step_id + r
    return req


def compare(gpu, cpu, what):
    """Returns the token mismatches; raises on any other disagreement."""
    mismatches = 0
    assert len(gpu.results) == len(cpu.results) == ROWS, what
    for i, (a, b) in enumerate(zip(gpu.results, cpu.results)):
        assert a.status.code == 0 and b.status.code == 0, f"{what} request {i}: {a.status} {b.status}"
        if list(a.token_ids) != list(b.token_ids):
            mismatches += 1
            continue
        for x, y in zip(a.logprobs, b.logprobs):
            assert abs(x - y) <= 1e-5, f"{what} request {i}: logprob {x} vs {y}"
        for x, y in zip(a.sum_smaller_probs, b.sum_smaller_probs):
            assert abs(x - y) <= 1e-5, f"{what} request {i}: sum_smaller_probs {x} vs {y}"
        for ta, tb in zip(a.top_logprobs, b.top_logprobs):
            for x, y in zip(ta.logprobs, tb.logprobs):
                assert abs(x - y) <= 1e-5, f"{what} request {i}: top logprob {x} vs {y}"
    return mismatches


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", required=True)
    parser.add_argument("--reference", required=True)
    parser.add_argument("--descriptors", required=True)
    args = parser.parse_args()
    cls, enum = load_messages(args.descriptors)
    gpu, cpu = Sampler(args.target, cls), Sampler(args.reference, cls)
    info = gpu.info(cls("GetServerInfoRequest")())
    assert info.backend == "cuda", f"--target serves backend {info.backend!r}, not cuda"

    torch.manual_seed(0)
    dev = torch.device("cuda", 0)
    stream = torch.cuda.Stream(dev)
    # The pool: room for an fp32 step after 3 rows of something else (a nonzero offset).
    pool = torch.zeros((ROWS + 3) * VOCAB, dtype=torch.float32, device=dev)
    storage = pool.untyped_storage()
    (device, handle, storage_bytes, storage_offset, *_rest) = storage._share_cuda_()
    assert len(handle) == 66 and handle[0] == 2 and handle[1:2] == b"c", (len(handle), handle[:2])
    reg = cls("RegisterBufferRequest")(name="torch-pool", kind=enum("BufferKind", "CUDA_IPC"),
                                       cuda_ipc_handle=handle, device_id=device,
                                       byte_size=storage_offset + storage_bytes)
    gpu.register(reg)
    ready = torch.cuda.Event(enable_timing=False, blocking=False, interprocess=True)
    total_mismatches = 0
    steps = 0
    for step_id in range(1, STEPS + 1):
        dtype = "FLOAT32" if step_id % 2 else "BFLOAT16"
        torch_dtype = torch.float32 if dtype == "FLOAT32" else torch.bfloat16
        elem = 4 if dtype == "FLOAT32" else 2
        first = 3 * VOCAB * 4 // elem  # element offset of the step's logits in the pool
        with torch.cuda.stream(stream):
            torch.cuda._sleep(40_000_000)  # ~20 ms at ~2 GHz: the write lands well after the send
            view = pool.view(torch_dtype)[first:first + ROWS * VOCAB].view(ROWS, VOCAB)
            view.copy_(torch.randn(ROWS, VOCAB, device=dev, dtype=torch.float32) * 2.0)
            ready.record(stream)
        req = make_step(cls, enum, step_id, dtype)
        byte_offset = storage_offset + first * elem
        if step_id % 3 == 0:  # a one-off handle instead of the region
            req.logits.cuda_ipc.handle = handle
            req.logits.cuda_ipc.byte_offset = byte_offset
            req.logits.cuda_ipc.device_id = device
        else:
            req.logits.buffer.name = "torch-pool"
            req.logits.buffer.byte_offset = byte_offset
        req.logits.ready_event = ready.ipc_handle()  # the same handle every step
        answer = gpu.sample.future(req)  # sent before the host waits for the logits
        with torch.cuda.stream(stream):
            host = view.cpu()  # waits for this stream only
        ref = make_step(cls, enum, step_id, dtype)
        ref.logits.data = host.view(torch.int16 if elem == 2 else torch.int32).numpy().tobytes()
        total_mismatches += compare(answer.result(), cpu.sample(ref), f"step {step_id} {dtype}")
        steps += 1

    # PyTorch's expandable-segments form has no IPC handle: refused, naming the setting.
    bad = cls("RegisterBufferRequest")()
    bad.CopyFrom(reg)
    bad.name = "expandable"
    bad.cuda_ipc_handle = bytes([2]) + b"e" + handle[2:]
    try:
        gpu.register(bad)
        raise AssertionError("an expandable-segments handle was accepted")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT or e.code() == grpc.StatusCode.FAILED_PRECONDITION, e
        assert "expandable_segments:False" in e.details(), e.details()
    gpu.unregister(cls("UnregisterBufferRequest")(name="torch-pool"))
    assert total_mismatches <= 1, f"{total_mismatches} token mismatches"
    print(f"torch_ipc_worker: {steps} steps x {ROWS} requests (fp32 and bf16, region and one-off "
          f"refs, torch {torch.__version__}): {total_mismatches} token mismatches; all agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
