"""The client's CUDA tensor path on a GPU (the GPU machine: scripts/gpu_e2e.sh). Skipped where
PyTorch has no CUDA device.

The logits pool is one PyTorch CUDA tensor registered with register_cuda_tensor; each step's
logits are a view into it at a nonzero offset. Each step the worker first queues a ~20 ms
sleep kernel on its stream, then writes new logits into the view, records a ReadyEvent and
sends the step without synchronising the host: a server that did not wait on the event would
read the previous step's logits and disagree. Every answer is compared with a samplerd on the
CPU backend sent the same logits inline: tokens equal (SPEC 8's boundary band aside: at most
one mismatch in all), processed logprobs within 1e-5. fp32 and bf16 steps, the registered
region and one-off cuda_ipc refs. PyTorch's expandable segments are refused, naming the setting.
"""
import grpc
import numpy as np
import pytest

import samplerd
from samplerd import Prefill, SamplingParams

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from conftest import Server  # noqa: E402

ROWS, VOCAB, STEPS = 16, 129280, 12


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    gpu = Server(tmp_path_factory.mktemp("gpu"), backend="cuda")
    cpu = Server(tmp_path_factory.mktemp("cpu"), backend="cpu")
    yield gpu, cpu
    assert gpu.stop() == 0 and cpu.stop() == 0


def requests(step_id):
    return [Prefill(f"t{r}", row=r, sample_position=30 + step_id,
                    params=SamplingParams(temperature=0.7, top_p=0.95, top_k=50, top_logprobs=5,
                                          seed=1000 * step_id + r))
            for r in range(ROWS)]


def compare(gpu, cpu, what):
    """Returns the token mismatches; fails on any other disagreement."""
    mismatches = 0
    for a, b in zip(gpu, cpu):
        if a.token_ids.tolist() != b.token_ids.tolist():
            mismatches += 1
            continue
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5, err_msg=what)
        np.testing.assert_allclose(a.sum_smaller_probs, b.sum_smaller_probs, atol=1e-5, err_msg=what)
        np.testing.assert_allclose(a.top_logprobs, b.top_logprobs, atol=1e-5, err_msg=what)
    return mismatches


def test_cuda_tensor_region_with_ready_event(servers):
    gpu_server, cpu_server = servers
    gpu = samplerd.SamplerClient(gpu_server.target, timeout=60)
    cpu = samplerd.SamplerClient(cpu_server.target, timeout=60)
    assert gpu.server_info().backend == "cuda"
    torch.manual_seed(0)
    dev = torch.device("cuda", 0)
    stream = torch.cuda.Stream(dev)
    # The pool: room for an fp32 step after 3 rows of something else (a nonzero offset).
    pool = torch.zeros((ROWS + 3) * VOCAB, dtype=torch.float32, device=dev)
    region = gpu.register_cuda_tensor("torch-pool", pool)
    assert [b.name for b in gpu.list_buffers()] == ["torch-pool"]
    ready = samplerd.ReadyEvent()
    mismatches = 0
    for step_id in range(1, STEPS + 1):
        dtype = torch.float32 if step_id % 2 else torch.bfloat16
        elem = torch.tensor([], dtype=dtype).element_size()
        first = 3 * VOCAB * 4 // elem
        with torch.cuda.stream(stream):
            torch.cuda._sleep(40_000_000)  # ~20 ms: the write lands well after the send
            view = pool.view(dtype)[first:first + ROWS * VOCAB].view(ROWS, VOCAB)
            view.copy_(torch.randn(ROWS, VOCAB, device=dev) * 2.0)
        logits = samplerd.CudaLogits(region, view, ready.record(stream))
        msg = gpu.build(logits, requests(step_id), step_id=step_id,
                        compute_sum_smaller_probs=True)
        if step_id % 3 == 0:  # a one-off handle instead of the registered region
            offset = msg.logits.buffer.byte_offset
            msg.logits.cuda_ipc.handle = region.handle
            msg.logits.cuda_ipc.byte_offset = offset
            msg.logits.cuda_ipc.device_id = region.device_id
        answer = gpu.sample_request(msg)  # the host never waited for the logits
        with torch.cuda.stream(stream):
            host = view.cpu()
        reference = cpu.sample(host, requests(step_id), step_id=step_id,
                               compute_sum_smaller_probs=True)
        mismatches += compare(answer, reference, f"step {step_id} {dtype}")
    assert mismatches <= 1, f"{mismatches} token mismatches"

    # PyTorch's expandable-segments form has no IPC handle: refused, naming the setting.
    bad = samplerd.pb.RegisterBufferRequest(name="expandable", kind=samplerd.pb.CUDA_IPC,
                                            cuda_ipc_handle=bytes([2]) + b"e" + region.handle[2:],
                                            device_id=region.device_id, byte_size=region.byte_size)
    with pytest.raises(samplerd.SamplerError) as e:
        gpu._call("RegisterBuffer", bad)
    assert e.value.code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION)
    assert "expandable_segments:False" in e.value.message
    gpu.unregister("torch-pool")
    print(f"test_cuda: {STEPS} steps x {ROWS} requests (fp32, bf16; region and one-off refs; "
          f"torch {torch.__version__}): {mismatches} token mismatches")


def test_the_followers_nccl_binding_on_one_gpu():
    """The ctypes calls the Python follower makes (init, broadcast, send, recv, async error,
    destroy), on a communicator of one rank: NCCL allows one rank per GPU, so a real follower
    needs a second GPU (scripts/gpu_multi.sh runs examples/cp_decode_loop.py there)."""
    from samplerd.follower import _Communicator, new_unique_id

    comm = _Communicator(new_unique_id(), world_size=1, rank=0, device=0, join_timeout=60,
                         op_timeout=30)
    words = torch.arange(100, dtype=torch.int32, device="cuda")
    comm.broadcast(words, root=0)
    comm.wait("broadcast")
    assert words.cpu().tolist() == list(range(100))
    src = torch.randn(1000, device="cuda")
    dst = torch.zeros(1000, device="cuda")
    comm.group_start()          # a send to itself and its receive, as one group call
    comm.send(src, peer=0)
    comm.recv(dst, peer=0)
    comm.group_end()
    comm.wait("send/recv")
    assert torch.equal(src, dst)
    comm.close()
