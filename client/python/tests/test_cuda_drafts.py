"""Issue 47: a speculative worker's draft distributions in its own GPU memory (the GPU machine:
scripts/gpu_mps.sh run). Skipped where PyTorch has no CUDA device.

One registered PyTorch tensor holds the step's target logits and the drafter's logprobs (fp32
and bf16 steps). Each step the worker queues a ~20 ms sleep on its stream, then writes the
drafts, records a ReadyEvent and sends the DECODE step without synchronising: a server that
did not wait on the drafts' event would verify against the previous step's drafts. Every answer
must equal, bitwise, the same step with the drafts sent inline (host memory), on the same CUDA
server; top-N drafts (a [q - 1, N] device tensor and its ids) likewise. A NaN in one request's
device draft row fails that request alone, naming the row and entry, as for host rows.
"""
import grpc
import numpy as np
import pytest

import samplerd
from samplerd import Decode, SamplingParams

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from conftest import Server  # noqa: E402

B, Q, VOCAB, N, STEPS = 8, 4, 32000, 16, 6


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    server = Server(tmp_path_factory.mktemp("gpu"), backend="cuda")
    yield samplerd.SamplerClient(server.target, timeout=60)
    assert server.stop() == 0


def requests(step_id, drafts, **kw):
    return [Decode(f"s{i}", first_row=i * Q, num_rows=Q, sample_position=40 + step_id,
                   draft_token_ids=drafts[i].tolist(),
                   params=SamplingParams(temperature=0.9, top_k=(None if i % 2 else 40),
                                         top_p=0.95, top_logprobs=3, seed=100 * step_id + i),
                   **{k: v[i] for k, v in kw.items()})
            for i in range(B)]


def same(a, b, what):
    assert len(a) == len(b), what
    for x, y in zip(a, b):
        rid = x.request_id
        assert x.ok and y.ok, (what, rid, x.message, y.message)
        assert x.token_ids.tolist() == y.token_ids.tolist(), (what, rid)
        assert x.num_accepted == y.num_accepted, (what, rid)
        assert x.logprobs.tobytes() == y.logprobs.tobytes(), (what, rid)
        assert x.top_logprobs.tobytes() == y.top_logprobs.tobytes(), (what, rid)


def test_device_drafts_answer_as_host_drafts(gpu):
    assert gpu.server_info().backend == "cuda"
    dev = torch.device("cuda", 0)
    torch.manual_seed(1)
    stream = torch.cuda.Stream(dev)
    rows_l, rows_q = B * Q, B * (Q - 1)
    pool = torch.zeros((rows_l + rows_q) * VOCAB, dtype=torch.float32, device=dev)
    torch.cuda.synchronize()
    region = gpu.register_cuda_tensor("spec-pool", pool)
    ready = samplerd.ReadyEvent()
    accepted = rejected = 0
    for step_id in range(1, STEPS + 1):
        dtype = torch.float32 if step_id % 2 else torch.bfloat16
        flat = pool.view(dtype)
        target = flat[:rows_l * VOCAB].view(rows_l, VOCAB)
        q = flat[rows_l * VOCAB:(rows_l + rows_q) * VOCAB].view(B, Q - 1, VOCAB)
        with torch.cuda.stream(stream):
            target.copy_(torch.randn(rows_l, VOCAB, device=dev) * 2.0)
            # The drafter: the target's rows plus noise, so drafts are often accepted.
            noisy = target.float().view(B, Q, VOCAB)[:, :Q - 1] + 0.5 * torch.randn(
                B, Q - 1, VOCAB, device=dev)
            drafts = noisy.argmax(dim=-1).int()
        stream.synchronize()
        drafts = drafts.cpu().numpy()
        with torch.cuda.stream(stream):
            torch.cuda._sleep(40_000_000)  # ~20 ms: the drafts land well after the send
            q.copy_(torch.log_softmax(noisy, dim=-1).to(dtype))
        event = ready.record(stream)
        logits = samplerd.CudaLogits(region, target, event)
        device_q = [samplerd.CudaLogits(region, q[i], event) for i in range(B)]
        answer = gpu.sample(logits, requests(step_id, drafts, draft_logprobs=device_q))
        stream.synchronize()
        host_q = [q[i].cpu() for i in range(B)]  # torch CPU tensors: sent inline, same dtype
        reference = gpu.sample(logits, requests(step_id, drafts, draft_logprobs=host_q))
        same(answer, reference, f"dense step {step_id} {dtype}")
        for r in answer:
            accepted += r.num_accepted
            rejected += r.num_accepted < Q - 1

        # Top-N rows: values in device memory, ids with the request.
        top = torch.topk(q.float(), N, dim=-1)
        values = torch.zeros((B, Q - 1, N), dtype=dtype, device=dev)
        values.copy_(top.values.to(dtype))
        torch.cuda.synchronize()  # no ready event for these: written before the send
        vregion = gpu.register_cuda_tensor("topn", values)
        ids = top.indices.int().cpu().numpy()
        topn_dev = [(samplerd.CudaLogits(vregion, values[i]), ids[i]) for i in range(B)]
        topn_host = [(values[i].cpu(), ids[i]) for i in range(B)]
        same(gpu.sample(logits, requests(step_id, drafts, draft_topn=topn_dev)),
             gpu.sample(logits, requests(step_id, drafts, draft_topn=topn_host)),
             f"top-N step {step_id} {dtype}")
        gpu.unregister("topn")
    assert accepted > 0 and rejected > 0, (accepted, rejected)

    # SPEC 6 on device rows: a NaN in request 3's draft row 1, entry 777, fails request 3 alone.
    target = pool[:rows_l * VOCAB].view(rows_l, VOCAB)
    q = pool[rows_l * VOCAB:(rows_l + rows_q) * VOCAB].view(B, Q - 1, VOCAB)
    target.copy_(torch.randn(rows_l, VOCAB, device=dev))
    q.copy_(torch.log_softmax(torch.randn(B, Q - 1, VOCAB, device=dev), dim=-1))
    q[3, 1, 777] = float("nan")
    torch.cuda.synchronize()
    drafts = np.zeros((B, Q - 1), dtype=np.int32)
    step = gpu.build(samplerd.CudaLogits(region, target),
                     requests(1, drafts, draft_logprobs=[samplerd.CudaLogits(region, q[i])
                                                         for i in range(B)]))
    answer = gpu.sample_request(step)
    bad = answer["s3"]
    assert not bad.ok and bad.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "requests[3].draft_logprobs: draft row 1 holds NaN at entry 777" in bad.message
    assert all(r.ok for r in answer if r.request_id != "s3"), [r.message for r in answer]
    gpu.unregister("spec-pool")
    print(f"test_cuda_drafts: {STEPS} steps x {B} requests (fp32, bf16; dense and top-{N}): "
          f"{accepted} drafts accepted, {rejected} requests with a rejection; bitwise equal")
