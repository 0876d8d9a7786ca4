"""Tokens written into the worker's GPU memory (StepOutput, issue 46) on a GPU machine
(scripts/gpu_mps.sh runs it with and without MPS). Skipped where PyTorch has no CUDA device.

- Every step's device tokens, accept counts and done word equal what the response says, for
  PREFILL, DECODE with drafts (accepted prefix then -1s) and a request that fails alone (-1s).
- The asynchronous loop: the worker sends step N, makes its stream wait on the done word, and
  builds step N+1's logits on the device from step N's device tokens (a one-hot that forces
  token (t + 1) mod V), before it reads step N's answer: every answer must then be the chain
  the host computes afterwards. A server that wrote late, or a wait that let the stream run
  early, breaks the chain.
- The done event: recorded after the writes, waited on after the answer.
- A step that fails as a whole writes nothing; release() frees the stream's wait.
- Writes go only where the owner registered for output: a region registered without it, a
  slice past its end and a misaligned offset are refused naming the field.
- examples/hf_generate.py's asynchronous loop (device_tokens) generates what its synchronous
  loop generates, stop tokens included (a transformers Llama at random weights on the GPU).
"""
import grpc
import numpy as np
import pytest

import samplerd
from samplerd import Decode, Prefill, SamplingParams, pb

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from conftest import Server  # noqa: E402

B, VOCAB = 16, 32000


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("gpu"), backend="cuda")
    yield s
    assert s.stop() == 0


@pytest.fixture
def client(server):
    with samplerd.SamplerClient(server.target, timeout=60) as c:
        yield c


def test_device_tokens_equal_the_response(client):
    dev = torch.device("cuda", 0)
    out = samplerd.TokenOutput(client, "out", max_requests=8, tokens_per_request=3)
    pool = torch.randn(8, VOCAB, device=dev)
    region = client.register_cuda_tensor("pool", pool)
    torch.cuda.synchronize()
    drafts = np.log(np.full((2, VOCAB), 1.0 / VOCAB, dtype=np.float32))
    # DECODE: a speculative request (q = 3), a failed one, two plain ones.
    requests = [Decode("spec", first_row=0, num_rows=3, draft_token_ids=[4, 7],
                       draft_logprobs=drafts, params=SamplingParams(seed=1)),
                Decode("bad", first_row=3, num_rows=1, params=SamplingParams(top_p=2.0)),
                Decode("a", first_row=4, num_rows=1, params=SamplingParams(seed=2)),
                Decode("b", first_row=5, num_rows=1, params=SamplingParams(seed=3))]
    msg = client.build(samplerd.CudaLogits(region, pool[:6]), requests)
    msg.output.CopyFrom(out.next(len(requests)))
    step = client.sample_request(msg)
    torch.cuda.synchronize()
    tokens = out.token_ids.cpu().numpy()
    for i, r in enumerate(step):
        want = list(r.token_ids) if r.ok else []
        assert tokens[i].tolist() == want + [-1] * (3 - len(want)), r.request_id
    assert out.num_accepted[:4].cpu().tolist() == [step["spec"].num_accepted, 0, 0, 0]
    assert out._done.item() == out.value
    # PREFILL through a batch, packed: one token each.
    msg = client.build_batch(samplerd.CudaLogits(region, pool), "prefill", np.arange(8),
                             seeds=np.arange(8, dtype=np.uint64), output=out.next(8))
    got = client.sample_request(msg)
    torch.cuda.synchronize()
    assert out.token_ids[:, 0].cpu().tolist() == got.token_ids.tolist()
    assert (out.token_ids[:, 1:] == -1).all()
    client.unregister("pool")
    client.unregister("out")


def test_the_asynchronous_loop_chains_on_the_device(client):
    """Step N+1's logits are made on the device from step N's device tokens before the host
    reads step N's answer."""
    dev = torch.device("cuda", 0)
    stream = torch.cuda.Stream(dev)
    out = samplerd.TokenOutput(client, "chain", max_requests=B)
    pool = torch.zeros(B, VOCAB, device=dev)
    region = client.register_cuda_tensor("chain-pool", pool)
    ready = samplerd.ReadyEvent()
    rows = np.arange(B)
    seeds = np.arange(B, dtype=np.uint64)
    params = SamplingParams(temperature=0.5, top_k=5)
    start = torch.arange(B, device=dev) * 100
    steps = 40
    with client.channel() as channel, torch.cuda.stream(stream):
        pool.zero_()
        pool[torch.arange(B, device=dev), start] = 50.0  # forces token start[i]
        answers = []
        request = client.build_batch(samplerd.CudaLogits(region, pool, ready.record(stream)),
                                     "decode", rows, params=params, seeds=seeds,
                                     output=out.next(B))
        channel.send(request)
        for n in range(steps):
            # The "forward" of step n + 1, queued before step n's answer is read: wait for the
            # tokens on the device, then a slow kernel, then logits that force token + 1.
            out.wait(stream)
            torch.cuda._sleep(2_000_000)
            nxt = (out.token_ids[:, 0].long() + 1) % VOCAB
            pool.zero_()
            pool[torch.arange(B, device=dev), nxt] = 50.0
            event = ready.record(stream)
            answers.append(channel.receive())
            if n + 1 < steps:
                channel.send(client.build_batch(samplerd.CudaLogits(region, pool, event),
                                                "decode", rows, params=params, seeds=seeds,
                                                output=out.next(B)))
        stream.synchronize()
    for n, got in enumerate(answers):
        assert got.ok
        np.testing.assert_array_equal(got.token_ids, (np.arange(B) * 100 + n) % VOCAB,
                                      err_msg=f"step {n}")
    client.unregister("chain-pool")
    client.unregister("chain")


def test_the_done_event_is_recorded_after_the_writes(client):
    dev = torch.device("cuda", 0)
    out = samplerd.TokenOutput(client, "ev", max_requests=4)
    pool = torch.randn(4, VOCAB, device=dev)
    region = client.register_cuda_tensor("ev-pool", pool)
    torch.cuda.synchronize()
    done = torch.cuda.Event(interprocess=True)
    done.record()  # an event must be recorded once before its handle is exported
    output = out.next(4)
    output.done_event = bytes(done.ipc_handle())
    got = client.sample_request(client.build_batch(samplerd.CudaLogits(region, pool), "prefill",
                                                   np.arange(4), output=output))
    side = torch.cuda.Stream(dev)
    side.wait_event(done)
    with torch.cuda.stream(side):
        copied = out.token_ids[:4, 0].clone()
    side.synchronize()
    assert copied.cpu().tolist() == got.token_ids.tolist()
    client.unregister("ev-pool")
    client.unregister("ev")


def test_a_failed_step_writes_nothing_and_release_frees_the_wait(client):
    dev = torch.device("cuda", 0)
    out = samplerd.TokenOutput(client, "fail", max_requests=4)
    torch.cuda.synchronize()
    msg = client.build_batch(np.zeros((4, 8), np.float32), "decode", np.arange(4),
                             output=out.next(4))
    msg.logits.cols = 9  # the inline bytes do not hold [4, 9]: the whole step fails
    stream = torch.cuda.Stream(dev)
    out.wait(stream)
    with torch.cuda.stream(stream):
        marker = torch.ones(1, device=dev)
    with pytest.raises(samplerd.SamplerError, match="logits"):
        client.sample_request(msg)
    assert out._done.item() != out.value  # not written
    out.release()
    stream.synchronize()  # would hang if the wait were not released
    assert marker.item() == 1.0
    client.unregister("fail")


def test_writes_only_into_output_regions(client):
    dev = torch.device("cuda", 0)
    plain = torch.zeros(64, dtype=torch.int32, device=dev)
    client.register_cuda_tensor("plain", plain)
    out = samplerd.TokenOutput(client, "small", max_requests=2)
    torch.cuda.synchronize()
    x = np.random.default_rng(0).normal(size=(4, 64)).astype(np.float32)

    def refused(output, match, code):
        with pytest.raises(samplerd.SamplerError, match=match) as e:
            client.sample_request(client.build_batch(x, "prefill", np.arange(len(x)),
                                                     output=output))
        assert e.value.code == code

    refused(pb.StepOutput(token_ids=pb.BufferSlice(name="plain")),
            r"output\.token_ids\.name: buffer 'plain' was not registered for output",
            grpc.StatusCode.FAILED_PRECONDITION)
    # 4 requests into a region sized for 2 (plus its tail): past its end.
    refused(pb.StepOutput(token_ids=pb.BufferSlice(name="small", byte_offset=out.region.base_offset + 4 * 62)),
            r"output\.token_ids\.byte_offset", grpc.StatusCode.INVALID_ARGUMENT)
    refused(pb.StepOutput(done_word=pb.BufferSlice(name="small", byte_offset=2)),
            r"output\.done_word\.byte_offset: 2 is not a multiple of 4",
            grpc.StatusCode.INVALID_ARGUMENT)
    assert (plain == 0).all()
    client.unregister("plain")
    client.unregister("small")


def test_the_examples_asynchronous_loop_generates_as_the_synchronous_one(client):
    pytest.importorskip("transformers")
    import pathlib
    import sys
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "examples"))
    from hf_generate import generate, tiny_llama

    model = tiny_llama().to("cuda")
    prompts = [[1, 17, 42, 7], [1, 99], [1, 5, 6, 7, 8, 9], [3, 3]]
    params = [SamplingParams(temperature=0), SamplingParams(temperature=0.8, top_p=0.95, seed=7,
                                                            top_logprobs=2),
              SamplingParams(temperature=1.0, top_k=40, repetition_penalty=1.2, seed=8),
              SamplingParams(temperature=0.7, seed=9)]
    free = generate(client, model, prompts, params, 24, device_tokens=False)
    # A stop token the synchronous run emitted early in one sequence: the asynchronous loop
    # must stop that sequence there too while the others go on.
    stop = free[2].tokens[3]
    stops_at = free[2].tokens.index(stop) + 1
    sync = generate(client, model, prompts, params, 24, stop_token_ids=[stop],
                    device_tokens=False)
    ahead = generate(client, model, prompts, params, 24, stop_token_ids=[stop],
                     device_tokens=True)
    assert [g.tokens for g in ahead] == [g.tokens for g in sync]
    assert [g.logprobs for g in ahead] == [g.logprobs for g in sync]
    assert len(sync[2].tokens) == stops_at
