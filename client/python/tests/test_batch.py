"""Steps from arrays and results as arrays (issue 46), against a real samplerd: a RequestBatch
answers bitwise as the same requests sent one message each; packed results hold the same
values as RequestResults; the channel's send()/receive() split answers as step(); bad arrays
and output regions the server cannot write fail naming the field."""
import grpc
import numpy as np
import pytest

import samplerd
from samplerd import Decode, Prefill, SamplingParams, pb

B, VOCAB = 16, 512


def logits(seed=0, rows=B):
    return np.random.default_rng(seed).normal(0, 2, (rows, VOCAB)).astype(np.float32)


PARAMS = SamplingParams(temperature=0.7, top_k=50, top_p=0.95, top_logprobs=5)


def seeded(seed):
    return SamplingParams(temperature=0.7, top_k=50, top_p=0.95, top_logprobs=5, seed=seed)


def per_request(client, x, seeds, positions, packed, kind="decode"):
    if kind == "decode":
        requests = [Decode(str(i), first_row=i, num_rows=1, sample_position=int(positions[i]),
                           params=seeded(int(seeds[i]))) for i in range(B)]
    else:
        requests = [Prefill(str(i), row=i, sample_position=int(positions[i]),
                            params=seeded(int(seeds[i]))) for i in range(B)]
    msg = client.build(x, requests, step_id=3)
    msg.packed_results = packed
    return client.sample_request(msg)


@pytest.mark.parametrize("kind", ["decode", "prefill"])
def test_a_batch_answers_as_its_requests_bitwise(server, kind):
    x = logits(1)
    seeds = np.arange(100, 100 + B, dtype=np.uint64)
    positions = np.arange(B, dtype=np.int64) * 7
    with samplerd.SamplerClient(server.target) as client:
        want = per_request(client, x, seeds, positions, packed=False, kind=kind)
        got = client.sample_request(client.build_batch(
            x, kind, np.arange(B), params=PARAMS, seeds=seeds, sample_positions=positions,
            step_id=3))
    assert isinstance(got, samplerd.BatchResult) and got.ok and len(got) == B
    assert got.step_id == 3
    np.testing.assert_array_equal(got.token_counts, np.ones(B))
    np.testing.assert_array_equal(got.token_ids, np.concatenate(want.token_ids))
    np.testing.assert_array_equal(got.logprobs, np.concatenate([r.logprobs for r in want]))
    np.testing.assert_array_equal(got.top_token_ids,
                                  np.concatenate([r.top_token_ids for r in want]))
    np.testing.assert_array_equal(got.top_logprobs,
                                  np.concatenate([r.top_logprobs for r in want]))
    np.testing.assert_array_equal(got.seq_seeds, seeds)
    np.testing.assert_array_equal(got.offsets, np.arange(B + 1))
    assert got.request_ids == [str(i) for i in range(B)]


def test_per_request_params_are_sent_once_each(server):
    """params per request: the distinct objects travel once (param_sets), indexed per request,
    and answer as the same requests sent one message each."""
    x = logits(5)
    cold, hot = SamplingParams(temperature=0.3, top_logprobs=2), SamplingParams(top_k=7)
    chosen = [cold if i % 3 else hot for i in range(B)]
    seeds = np.arange(B, dtype=np.uint64) + 50
    with samplerd.SamplerClient(server.target) as client:
        msg = client.build_batch(x, "decode", np.arange(B), params=chosen, seeds=seeds)
        assert len(msg.inputs.batch.param_sets) == 2
        got = client.sample_request(msg)
        want = client.sample_request(client.build(x, [
            Decode(str(i), first_row=i, num_rows=1, params=SamplingParams(
                **{k: v for k, v in vars(chosen[i]).items() if not k.startswith("_") and k != "seed"},
                seed=int(seeds[i]))) for i in range(B)]))
        np.testing.assert_array_equal(got.token_ids, np.concatenate(want.token_ids))
        np.testing.assert_array_equal(got.logprobs, np.concatenate([r.logprobs for r in want]))
        msg.inputs.batch.param_index = np.full(B, 2, "<i4").tobytes()
        with pytest.raises(samplerd.SamplerError, match=r"inputs.batch.param_index: entry 0 is 2"):
            client.sample_request(msg)
        msg.inputs.batch.params.top_k = 3
        with pytest.raises(samplerd.SamplerError, match=r"set either params or param_sets"):
            client.sample_request(msg)


def test_packed_results_hold_what_request_results_hold(server):
    """A mixed step (a failed request, a speculative one, sum-of-smaller-probs) answered both
    ways: the arrays hold the RequestResults' values, padded as documented."""
    x = logits(2, rows=6)
    drafts = np.log(np.full((2, VOCAB), 1.0 / VOCAB, dtype=np.float32))
    requests = [Decode("spec", first_row=0, num_rows=3, draft_token_ids=[4, 7],
                       draft_logprobs=drafts, params=SamplingParams(seed=3, top_logprobs=3)),
                Decode("bad", first_row=3, num_rows=1, params=SamplingParams(top_p=2.0, seed=1)),
                Decode("short", first_row=4, num_rows=1, params=SamplingParams(seed=5,
                                                                                top_logprobs=1)),
                Decode("none", first_row=5, num_rows=1, params=SamplingParams(seed=6))]
    with samplerd.SamplerClient(server.target) as client:
        msg = client.build(x, requests, step_id=9, compute_sum_smaller_probs=True)
        want = client.sample_request(msg)
        msg.packed_results = True
        got = client.sample_request(msg)
    assert not got.ok and got.request_ids == ["spec", "bad", "short", "none"]
    assert list(got.codes) == [0, grpc.StatusCode.INVALID_ARGUMENT.value[0], 0, 0]
    assert got.errors == [want["bad"].message] and "top_p" in got.errors[0]
    with pytest.raises(samplerd.RequestError, match="top_p"):
        got.raise_for_errors()
    ok = [r for r in want if r.ok]
    np.testing.assert_array_equal(got.token_counts, [len(want["spec"].token_ids), 0, 1, 1])
    np.testing.assert_array_equal(got.num_accepted, [want["spec"].num_accepted, 0, 0, 0])
    np.testing.assert_array_equal(got.token_ids, np.concatenate([r.token_ids for r in ok]))
    np.testing.assert_array_equal(got.logprobs, np.concatenate([r.logprobs for r in ok]))
    np.testing.assert_array_equal(got.sum_smaller_probs,
                                  np.concatenate([r.sum_smaller_probs for r in ok]))
    assert got.top_token_ids.shape == (len(got.token_ids), 3)
    spec = len(want["spec"].token_ids)
    np.testing.assert_array_equal(got.top_token_ids[:spec], want["spec"].top_token_ids)
    np.testing.assert_array_equal(got.top_token_ids[spec, :1], want["short"].top_token_ids[0])
    np.testing.assert_array_equal(got.top_token_ids[spec, 1:], [-1, -1])
    assert np.all(np.isneginf(got.top_logprobs[spec + 1]))  # "none" asked for no top logprobs
    np.testing.assert_array_equal(got.seq_seeds, [r.seq_seed for r in want])


def test_the_channel_split_answers_as_step(server):
    x = logits(4)
    with samplerd.SamplerClient(server.target) as client, client.channel() as channel:
        request = client.build_batch(x, "decode", np.arange(B), params=PARAMS,
                                     seeds=np.arange(B, dtype=np.uint64), step_id=1)
        whole = channel.step_request(request)
        channel.send(request)
        with pytest.raises(samplerd.SamplerError, match="one step at a time"):
            channel.send(request)
        split = channel.receive()
        with pytest.raises(samplerd.SamplerError, match="no step was sent"):
            channel.receive()
    np.testing.assert_array_equal(split.token_ids, whole.token_ids)
    np.testing.assert_array_equal(split.top_logprobs, whole.top_logprobs)


def bad_batch(client, **changes):
    msg = client.build_batch(logits(), "decode", np.arange(B), params=PARAMS, step_id=1)
    for name, value in changes.items():
        setattr(msg.inputs.batch, name, value)
    with pytest.raises(samplerd.SamplerError) as e:
        client.sample_request(msg)
    return e.value


@pytest.mark.parametrize("field,value", [
    ("rows", b"\x00" * 6),                    # not whole int32s
    ("num_rows", b"\x01\x00\x00\x00"),        # one entry for 16 requests
    ("sample_positions", b"\x00" * (8 * B + 1)),
    ("seq_seeds", b"\x00" * 8),
])
def test_bad_arrays_fail_naming_the_field(server, field, value):
    with samplerd.SamplerClient(server.target) as client:
        error = bad_batch(client, **{field: value})
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"inputs.batch.{field}" in str(error)


def test_batch_and_requests_together_or_too_many_are_refused(server):
    with samplerd.SamplerClient(server.target) as client:
        msg = client.build_batch(logits(), "decode", np.arange(B), params=PARAMS)
        msg.inputs.requests.add(request_id="x")
        with pytest.raises(samplerd.SamplerError, match="inputs.batch: set either"):
            client.sample_request(msg)
        # A batch's size is checked before anything per request is made.
        error = bad_batch(client, rows=b"\x00" * (4 * (1 << 17)))
        assert "requests exceed" in str(error) and "inputs.batch.rows" in str(error)
        # A row outside the logits is named as the request it became (as with `requests`).
        rows = np.arange(B)
        rows[3] = B + 5
        with pytest.raises(samplerd.SamplerError, match=r"inputs.requests\[3\].first_row"):
            client.sample_request(client.build_batch(logits(), "decode", rows, params=PARAMS,
                                                     request_id_prefix="r"))


def test_outputs_need_a_gpu_and_an_output_region(server):
    """On the CPU backend no region takes writes: output slices fail naming the field, and a
    HOST_SHM region cannot be registered for output."""
    with samplerd.SamplerClient(server.target) as client:
        output = pb.StepOutput(token_ids=pb.BufferSlice(name="nowhere"),
                               done_word=pb.BufferSlice(name="nowhere", byte_offset=64))
        with pytest.raises(samplerd.SamplerError, match=r"output\.token_ids\.name") as e:
            client.sample_request(client.build_batch(logits(), "decode", np.arange(B),
                                                     params=PARAMS, output=output))
        assert e.value.code == grpc.StatusCode.NOT_FOUND
        region = samplerd.ShmRegion(4096)
        request = pb.RegisterBufferRequest(name="out", kind=pb.HOST_SHM, shm_name=region.name,
                                           byte_size=4096, output=True)
        with pytest.raises(samplerd.SamplerError, match="output: only CUDA_IPC") as e:
            client._call("RegisterBuffer", request)
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        region.close()
