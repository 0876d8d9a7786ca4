"""Issue 47: a tensor-parallel worker's logits shards read in place (the GPU machine:
scripts/gpu_mps.sh run). Skipped where PyTorch has no CUDA device.

TP = 2 simulated on one GPU by two processes, as a worker whose lm_head is split by columns:
this process is rank 0 and a child process is rank 1. Each holds its own CUDA tensor with its
half of the vocabulary (rows padded past the shard, so the two strides differ), and each step
queues a ~20 ms sleep on its own stream before writing its half and recording its own
ReadyEvent, without synchronising the host. Rank 0 registers its tensor; rank 1 exported its
storage's CUDA IPC handle and event once, and rank 0 names them (a one-off cuda_ipc ref). The
step sent as those two shards must answer bitwise as the same logits sent whole, in fp32 and
bf16: a server that did not wait on rank 1's event would read its previous step's half.
Then the hostile shards a careless worker could send (a shard on another device, overlapping
slices, columns that do not add up, a host shard beside device shards) each fail the step
naming the field, and the next step is served.
"""
import json
import os
import subprocess
import sys

import grpc
import numpy as np
import pytest

import samplerd
from samplerd import Prefill, SamplingParams

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from conftest import Server  # noqa: E402

ROWS, VOCAB, STEPS = 16, 129280, 6
HALF = VOCAB // 2
PAD = (24, 40)  # each rank's row padding, in fp32 elements

# Rank 1: its shard [ROWS, VOCAB - HALF (+ padding)] in its own allocation; on each command it
# queues a sleep, writes its half of that step's logits and records its event, then says so.
RANK1 = r"""
import json, sys, torch
from samplerd.cuda import CudaRegion, ReadyEvent
rows, vocab, half, pad, gpu = map(int, sys.argv[1:6])
dev = torch.device("cuda", gpu)
stream = torch.cuda.Stream(dev)
shard = torch.zeros(rows, vocab - half + pad, dtype=torch.float32, device=dev)
region = CudaRegion.from_tensor("rank1", shard)
ready = ReadyEvent()
event = ready.record(stream)
print(json.dumps({"handle": region.handle.hex(), "device_id": region.device_id,
                  "offset": region.base_offset, "stride": shard.stride(0),
                  "event": event.hex()}), flush=True)
for line in sys.stdin:
    cmd = json.loads(line)
    if cmd.get("quit"):
        break
    dtype = getattr(torch, cmd["dtype"])
    g = torch.Generator().manual_seed(cmd["step"])
    full = (torch.randn(rows, vocab, generator=g) * 2.0).to(dtype)
    src = full[:, half:].to(dev)  # uploaded first: the host must not wait on the sleep below
    with torch.cuda.stream(stream):
        torch.cuda._sleep(40_000_000)
        view = shard.view(dtype)[:, :vocab - half]
        view.copy_(src)
        src.record_stream(stream)
        ready.record(stream)
    print("queued", flush=True)
torch.cuda.synchronize()
"""


def step_logits(step, dtype):
    g = torch.Generator().manual_seed(step)
    return (torch.randn(ROWS, VOCAB, generator=g) * 2.0).to(dtype)


def requests(step_id):
    return [Prefill(f"t{r}", row=r, sample_position=30 + step_id,
                    params=SamplingParams(temperature=0.7, top_p=0.95,
                                          top_k=(50 if r % 2 else None), top_logprobs=5,
                                          seed=1000 * step_id + r))
            for r in range(ROWS)]


def same(a, b, what):
    assert len(a) == len(b), what
    for x, y in zip(a, b):
        assert x.ok and y.ok, (what, x.message, y.message)
        assert x.token_ids.tolist() == y.token_ids.tolist(), (what, x.request_id)
        assert x.logprobs.tobytes() == y.logprobs.tobytes(), (what, x.request_id)
        assert x.top_logprobs.tobytes() == y.top_logprobs.tobytes(), (what, x.request_id)
        assert x.sum_smaller_probs.tobytes() == y.sum_smaller_probs.tobytes(), (what, x.request_id)


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    server = Server(tmp_path_factory.mktemp("gpu"), backend="cuda")
    yield samplerd.SamplerClient(server.target, timeout=60)
    assert server.stop() == 0


def start_rank1(gpu_index):
    proc = subprocess.Popen([sys.executable, "-c", RANK1, str(ROWS), str(VOCAB), str(HALF),
                             str(PAD[1]), str(gpu_index)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    return proc, json.loads(proc.stdout.readline())


def stop_rank1(proc):
    proc.stdin.write(json.dumps({"quit": True}) + "\n")
    proc.stdin.flush()
    assert proc.wait(timeout=60) == 0


@pytest.fixture(scope="module")
def rank1():
    proc, exported = start_rank1(0)
    yield proc, exported
    stop_rank1(proc)


def rank1_tensor(exported, dtype, device_id=None):
    """Rank 1's shard as rank 0 names it: its exported handle, a one-off cuda_ipc ref."""
    elem = torch.tensor([], dtype=dtype).element_size()
    t = samplerd.pb.Tensor(dtype={torch.float32: samplerd.pb.FLOAT32,
                                  torch.bfloat16: samplerd.pb.BFLOAT16}[dtype],
                           rows=ROWS, cols=VOCAB - HALF, row_stride=exported["stride"] * 4 // elem,
                           ready_event=bytes.fromhex(exported["event"]))
    t.cuda_ipc.handle = bytes.fromhex(exported["handle"])
    t.cuda_ipc.byte_offset = exported["offset"]
    t.cuda_ipc.device_id = exported["device_id"] if device_id is None else device_id
    return t


def run_tp2_steps(gpu, proc, exported, shard0, region0, whole, region_whole):
    """STEPS steps from rank 0's and rank 1's shards, each against the same logits whole."""
    dev = shard0.device
    stream = torch.cuda.Stream(dev)
    ready0 = samplerd.ReadyEvent()
    for step_id in range(1, STEPS + 1):
        dtype = torch.float32 if step_id % 2 else torch.bfloat16
        proc.stdin.write(json.dumps({"step": step_id, "dtype": str(dtype).split(".")[1]}) + "\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "queued"
        full = step_logits(step_id, dtype).to(dev)
        with torch.cuda.stream(stream):
            torch.cuda._sleep(40_000_000)
            view0 = shard0.view(dtype)[:, :HALF]
            view0.copy_(full[:, :HALF])
            full.record_stream(stream)
        event0 = ready0.record(stream)
        sharded = samplerd.ShardedLogits([samplerd.CudaLogits(region0, view0, event0),
                                          rank1_tensor(exported, dtype)])
        answer = gpu.sample_request(gpu.build(sharded, requests(step_id), step_id=step_id,
                                              compute_sum_smaller_probs=True))
        whole_view = whole.view(dtype)[:, :VOCAB]
        whole_view.copy_(full)
        torch.cuda.synchronize()
        reference = gpu.sample_request(gpu.build(samplerd.CudaLogits(region_whole, whole_view),
                                                 requests(step_id), step_id=step_id,
                                                 compute_sum_smaller_probs=True))
        same(answer, reference, f"step {step_id} {dtype}")
    torch.cuda.synchronize()


def test_tp2_shards_answer_as_whole_logits(gpu, rank1):
    proc, exported = rank1
    assert gpu.server_info().backend == "cuda"
    dev = torch.device("cuda", 0)
    shard0 = torch.zeros(ROWS, HALF + PAD[0], dtype=torch.float32, device=dev)
    whole = torch.zeros(ROWS, VOCAB, dtype=torch.float32, device=dev)
    region0 = gpu.register_cuda_tensor("rank0", shard0)
    region_whole = gpu.register_cuda_tensor("whole", whole)
    run_tp2_steps(gpu, proc, exported, shard0, region0, whole, region_whole)

    # Hostile shards: each fails the step naming the field; the next step is served.
    dtype = torch.float32
    view0 = shard0[:, :HALF]

    def refused(msg, code, field, why):
        with pytest.raises(samplerd.SamplerError) as e:
            gpu.sample_request(msg)
        assert e.value.code == code, e.value.message
        assert field in e.value.message and why in e.value.message, e.value.message

    def build(*shards):
        return gpu.build(samplerd.ShardedLogits(list(shards)), requests(1), step_id=99)

    refused(build(samplerd.CudaLogits(region0, view0), rank1_tensor(exported, dtype, device_id=99)),
            grpc.StatusCode.FAILED_PRECONDITION, "logits.shards[1].cuda_ipc.device_id",
            "is not the server's CUDA device")
    # Rank 1's columns named inside rank 0's bytes, 4 elements in.
    overlap = samplerd.CudaLogits(region0, shard0.as_strided((ROWS, VOCAB - HALF),
                                                             (HALF + PAD[0], 1), 4))
    refused(build(samplerd.CudaLogits(region0, view0), overlap),
            grpc.StatusCode.INVALID_ARGUMENT, "logits.shards[1]", "overlap")
    msg = build(samplerd.CudaLogits(region0, view0), rank1_tensor(exported, dtype))
    msg.logits.cols += 1
    refused(msg, grpc.StatusCode.INVALID_ARGUMENT, "logits.cols", "added up")
    host = np.zeros((ROWS, 8), dtype=np.float32)
    refused(build(samplerd.CudaLogits(region0, view0), rank1_tensor(exported, dtype), host),
            grpc.StatusCode.INVALID_ARGUMENT, "logits.shards[2]", "same kind of memory")
    served = gpu.sample_request(build(samplerd.CudaLogits(region0, view0),
                                      rank1_tensor(exported, dtype)))
    assert all(r.ok for r in served)
    gpu.unregister("rank0")
    gpu.unregister("whole")
    print(f"test_cuda_shards: {STEPS} TP=2 steps x {ROWS} requests (fp32, bf16) bitwise equal "
          f"to the whole logits; 4 hostile shard steps refused")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (scripts/gpu_multi.sh)")
def test_tp2_shard_on_a_peer_gpu(gpu):
    """Rank 1 on GPU 1 (its handle's device_id 1): samplerd on GPU 0 reads its shard by peer
    access, bitwise as the whole logits; where the two GPUs have no peer access it must refuse
    naming logits.shards[1].cuda_ipc.device_id instead."""
    proc, exported = start_rank1(1)
    try:
        assert exported["device_id"] == 1
        dev = torch.device("cuda", 0)
        shard0 = torch.zeros(ROWS, HALF + PAD[0], dtype=torch.float32, device=dev)
        whole = torch.zeros(ROWS, VOCAB, dtype=torch.float32, device=dev)
        region0 = gpu.register_cuda_tensor("peer-rank0", shard0)
        region_whole = gpu.register_cuda_tensor("peer-whole", whole)
        if torch.cuda.can_device_access_peer(0, 1):
            run_tp2_steps(gpu, proc, exported, shard0, region0, whole, region_whole)
        else:
            msg = gpu.build(samplerd.ShardedLogits([samplerd.CudaLogits(region0, shard0[:, :HALF]),
                                                    rank1_tensor(exported, torch.float32)]),
                            requests(1), step_id=1)
            with pytest.raises(samplerd.SamplerError) as e:
                gpu.sample_request(msg)
            assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
            assert "logits.shards[1].cuda_ipc.device_id" in e.value.message
        gpu.unregister("peer-rank0")
        gpu.unregister("peer-whole")
    finally:
        stop_rank1(proc)
