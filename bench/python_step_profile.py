"""Where a Python client's step goes (issue 29's profile): building the request, the
SampleStream round trip, a unary call, raw bytes over grpc, protobuf serialisation and parsing,
results to numpy, a step from arrays and its packed answer (issue 46), and the co-located step
channel, against a running samplerd, with logits in
a registered shm region. Prints p50 (and p99 for the step paths) in microseconds.

    python3 bench/python_step_profile.py HOST:PORT [ROWS] [VOCAB] [cuda]

`cuda`: the logits in a registered PyTorch CUDA tensor (CUDA IPC, read in place, as a GPU
worker sends them) instead of shm.
"""
import statistics
import sys
import time

import numpy as np

import samplerd
from samplerd import pb

target = sys.argv[1]
rows = int(sys.argv[2]) if len(sys.argv) > 2 else 16
vocab = int(sys.argv[3]) if len(sys.argv) > 3 else 128256
on_gpu = len(sys.argv) > 4 and sys.argv[4] == "cuda"
N = 1000


def measure(label, f, tail=False):
    for _ in range(100):
        f()
    ts = []
    for _ in range(N):
        t = time.perf_counter()
        f()
        ts.append((time.perf_counter() - t) * 1e6)
    ts.sort()
    extra = f"  p99 {ts[int(len(ts) * 0.99)]:8.1f}" if tail else ""
    print(f"{label:34s} p50 {statistics.median(ts):8.1f} us{extra}", flush=True)


client = samplerd.SamplerClient(target)
client.wait_ready()
if on_gpu:
    import torch

    x = torch.randn(rows, vocab, device="cuda") * 2
    torch.cuda.synchronize()
    region = client.register_cuda_tensor("profile-pool", x)
    logits = samplerd.CudaLogits(region, x)
else:
    region = samplerd.ShmRegion(rows * vocab * 4)
    x = region.ndarray((rows, vocab), np.float32)
    x[:] = np.random.default_rng(0).normal(0, 2, x.shape)
    client.register_shm(region)
    logits = samplerd.ShmLogits(region, x)
requests = [samplerd.Decode(f"r{i}", first_row=i, num_rows=1, sample_position=5,
                            params=samplerd.SamplingParams(temperature=0.7, top_k=50, top_p=0.95,
                                                           top_logprobs=5, seed=i))
            for i in range(rows)]
print(f"{rows} rows, V = {vocab}, {'CUDA IPC' if on_gpu else 'shm'} logits; samplerd "
      f"{client.server_info().backend}")
measure("build the SampleRequest", lambda: client.build(logits, requests))
request = client.build(logits, requests)
data = request.SerializeToString()
measure("serialize", request.SerializeToString)
stream = client.stream()
measure("SampleStream send + recv", lambda: (stream.send(request), stream.recv()), tail=True)
measure("unary Sample", lambda: client.sample_request(request), tail=True)
unary = client._channel.unary_unary(f"/{samplerd._proto.SERVICE}/Sample")


def raw(request_bytes):
    """Sample on raw bytes, as this client (its id scopes the registered region)."""
    return unary(request_bytes, metadata=client._metadata)


measure("unary Sample, raw bytes", lambda: raw(data), tail=True)
answer = raw(data)
measure("parse the SampleResponse", lambda: pb.SampleResponse.FromString(answer))
step = client.sample_request(request)
measure("results to numpy (token ids)", lambda: [r.token_ids for r in step])
timing = pb.SampleResponse.FromString(answer).timing
print(f"{'server: total / compute':34s}     {timing.total_us:8d} / {timing.compute_us} us")
# Issue 46's arrays: the same step from arrays (build_batch, no object per request) and its
# packed answer as arrays (BatchResult), against the target of <= 30 us each at B = 64.
batch_rows = np.arange(rows, dtype=np.int32)
batch_seeds = np.arange(rows, dtype=np.uint64)
batch_positions = np.full(rows, 5, np.int64)
shared = requests[0].params
measure("build_batch (arrays)", lambda: client.build_batch(
    logits, "decode", batch_rows, params=shared, seeds=batch_seeds,
    sample_positions=batch_positions))
batch_request = client.build_batch(logits, "decode", batch_rows, params=shared, seeds=batch_seeds,
                                   sample_positions=batch_positions)
packed = raw(batch_request.SerializeToString())
measure("parse + BatchResult (arrays)",
        lambda: samplerd.results.BatchResult(pb.SampleResponse.FromString(packed)))
with client.channel() as channel:
    measure("step channel", lambda: channel.step_request(request), tail=True)
    if on_gpu:
        # The tokens back on the device: alone, and right after a step (samplerd's kernels ran
        # in its own CUDA context just before: two processes share the GPU by time-slicing).
        measure("token ids to a CUDA tensor", lambda: torch.tensor([1] * rows, device="cuda"))
        measure("  the same right after a step", lambda: (
            channel.step_request(request), torch.tensor([1] * rows, device="cuda")))
stream.close()
del x, logits
client.unregister(region.name if on_gpu else region.buffer_name)
if not on_gpu:
    region.close()
