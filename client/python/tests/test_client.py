"""The Python client against a real samplerd (CPU backend by default): every rpc it wraps,
inline and shm logits, unary, streaming and asyncio step loops, errors, decoding of results.

Expected values come from numpy (greedy tokens, log_softmax, top-k lists) or from a second
route to the same step (shm vs inline, stream vs unary): seeded steps are deterministic.
"""
import asyncio
import math
import os
import pathlib
import subprocess
import sys

import grpc
import numpy as np
import pytest

import samplerd
from samplerd import Decode, Prefill, SamplingParams

ROWS, VOCAB = 4, 1000


def logits(seed, rows=ROWS, vocab=VOCAB):
    return np.random.default_rng(seed).normal(0, 2, (rows, vocab)).astype(np.float32)


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def prefill(rows=ROWS, **params):
    return [Prefill(f"r{i}", row=i, sample_position=7, params=SamplingParams(seed=100 + i, **params))
            for i in range(rows)]


def test_info_health_and_buffers(client):
    info = client.server_info()
    assert info.backend in ("cpu", "cuda")
    assert info.limits.max_top_logprobs >= 20
    assert client.health() == "SERVING"
    assert client.health("samplerd.v1.Sampler") == "SERVING"
    assert client.list_buffers() == []


def test_greedy_tokens_and_logprobs_match_numpy(client):
    x = logits(1)
    step = client.sample(x, prefill(top_k=1, top_logprobs=0))
    ref = log_softmax(x)
    for i, r in enumerate(step):
        assert r.ok, r
        assert r.token_ids.tolist() == [int(np.argmax(x[i]))]
        # top_k = 1 keeps one token: its processed logprob is 0 (SPEC 3.9).
        assert r.logprobs.tolist() == [0.0]
    # Temperature 1, no cuts: the top logprobs are numpy's log_softmax top 5, in order.
    step = client.sample(x, prefill(top_logprobs=5))
    for i, r in enumerate(step):
        order = np.argsort(-x[i], kind="stable")[:5]
        assert r.top_token_ids.shape == (1, 5)
        assert r.top_token_ids[0].tolist() == order.tolist()
        np.testing.assert_allclose(r.top_logprobs[0], ref[i][order], atol=1e-5)
        tok = int(r.token_ids[0])
        assert math.isclose(float(r.logprobs[0]), ref[i][tok], abs_tol=1e-5)
    # The step's timing parts: kernel time only on the CUDA backend, never more than compute.
    info = client.server_info()
    assert step.prepare_us >= 0 and step.compute_us >= 0
    assert step.kernel_us <= step.compute_us + 1
    if info.backend == "cpu":
        assert step.kernel_us == 0
    else:
        assert step.kernel_us > 0


def test_shm_region_gives_the_inline_answer(client):
    x = logits(2)
    with samplerd.ShmRegion(2 * x.nbytes) as region:
        view = region.ndarray(x.shape, np.float32, byte_offset=x.nbytes)  # nonzero offset
        view[:] = x
        name = client.register_shm(region)
        assert [b.name for b in client.list_buffers()] == [name]
        by_shm = client.sample(samplerd.ShmLogits(region, view), prefill(temperature=0.8, top_p=0.9))
        inline = client.sample(x, prefill(temperature=0.8, top_p=0.9))
        assert [r.token_ids.tolist() for r in by_shm] == [r.token_ids.tolist() for r in inline]
        assert [r.logprobs.tolist() for r in by_shm] == [r.logprobs.tolist() for r in inline]
        # A view past the region's end never leaves the client.
        with pytest.raises(ValueError):
            region.ndarray((ROWS, VOCAB), np.float32, byte_offset=x.nbytes + 4)
        client.unregister(name)
        del view
        with pytest.raises(samplerd.SamplerError) as e:
            client.unregister(name)
        assert e.value.code == grpc.StatusCode.NOT_FOUND


def test_stream_and_async_loops_equal_unary(client, server):
    steps = [logits(10 + s) for s in range(8)]
    unary = [client.sample(x, prefill(temperature=0.7), step_id=s).token_ids
             for s, x in enumerate(steps)]
    with client.stream() as stream:
        streamed = [stream.step(x, prefill(temperature=0.7), step_id=s).token_ids
                    for s, x in enumerate(steps)]
        # Pipelined: all sent, then all received, in order.
        for s, x in enumerate(steps):
            stream.send(client.build(x, prefill(temperature=0.7), step_id=s))
        piped = [stream.recv() for _ in steps]
    assert [p.step_id for p in piped] == list(range(len(steps)))
    to_list = lambda a: [[t.tolist() for t in step] for step in a]
    assert to_list(streamed) == to_list(unary)
    assert to_list([p.token_ids for p in piped]) == to_list(unary)

    async def run():
        async with samplerd.AsyncSamplerClient(server.target, timeout=30) as ac:
            assert await ac.health() == "SERVING"
            assert await ac.list_buffers() == [] and await ac.groups() == []
            one = [(await ac.sample(x, prefill(temperature=0.7), step_id=s)).token_ids
                   for s, x in enumerate(steps)]
            async with ac.stream() as st:
                two = [(await st.step(x, prefill(temperature=0.7), step_id=s)).token_ids
                       for s, x in enumerate(steps)]
            return one, two

    one, two = asyncio.run(run())
    assert to_list(one) == to_list(unary) and to_list(two) == to_list(unary)


def test_errors_carry_the_code_and_field(client):
    reqs = prefill(2)
    reqs[1].params.top_p = 1.5
    step = client.sample(logits(3), reqs)
    assert step["r0"].ok and step["r0"].token_ids.shape == (1,)
    assert not step["r1"].ok
    with pytest.raises(samplerd.RequestError) as e:
        step["r1"].token_ids
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "top_p" in e.value.message and e.value.request_id == "r1"
    with pytest.raises(samplerd.RequestError):
        step.raise_for_errors()

    # A step-level fault: unknown buffer (unary), then the same on a stream, which goes on.
    bad = client.build(logits(3), prefill())
    bad.logits.ClearField("data")
    bad.logits.buffer.name = "no-such-buffer"
    with pytest.raises(samplerd.SamplerError) as e:
        client.sample_request(bad)
    assert e.value.code == grpc.StatusCode.NOT_FOUND and "no-such-buffer" in e.value.message
    with client.stream() as stream:
        stream.send(bad)
        with pytest.raises(samplerd.SamplerError) as e:
            stream.recv()
        assert e.value.code == grpc.StatusCode.NOT_FOUND
        assert stream.step(logits(3), prefill()).raise_for_errors()[0].ok


def test_sharded_logits_answer_as_whole(client):
    """ShardedLogits: a vocabulary split by columns (three uneven host shards) answers as the
    same logits sent whole; on the CPU backend, shards in device memory are refused."""
    x = logits(30)
    whole = client.sample(x, prefill(temperature=0.8, top_logprobs=4))
    cuts = [0, 5, 41, x.shape[1]]
    parts = [np.ascontiguousarray(x[:, a:b]) for a, b in zip(cuts, cuts[1:])]
    sharded = client.sample(samplerd.ShardedLogits(parts), prefill(temperature=0.8, top_logprobs=4))
    for a, b in zip(whole, sharded):
        assert a.token_ids.tolist() == b.token_ids.tolist()
        assert a.logprobs.tobytes() == b.logprobs.tobytes()
        assert a.top_logprobs.tobytes() == b.top_logprobs.tobytes()
    if client.server_info().backend != "cpu":
        return
    device = samplerd.pb.Tensor(dtype=samplerd.pb.FLOAT32, rows=x.shape[0], cols=4)
    device.cuda_ipc.handle = bytes(64)
    with pytest.raises(samplerd.SamplerError) as e:
        client.sample(samplerd.ShardedLogits([device, device]), prefill())
    assert e.value.code.name == "FAILED_PRECONDITION", e.value.message
    assert "logits.shards[0].cuda_ipc" in e.value.message


def test_token_adjustments(client):
    """SPEC 3 step 2 through the client's SamplingParams: each adjustment's effect on the whole
    processed distribution (top_logprobs = 64 on a 64-token vocabulary) against numpy."""
    assert client.server_info().limits.max_token_list > 0
    x = logits(4, rows=4, vocab=64)
    reqs = [
        Prefill("bias", row=0, params=SamplingParams(seed=1, top_logprobs=64,
                                                       logit_bias={3: 2.5, 10: -1.0})),
        Prefill("allowed", row=1, params=SamplingParams(seed=2, top_logprobs=64,
                                                          allowed_token_ids=[4, 8, 15])),
        Prefill("bad", row=2, output_token_ids=[6, 9],
                params=SamplingParams(seed=3, top_logprobs=64, bad_words=[[9, 1], [6, 9, 2], [5]],
                                      min_tokens=3, stop_token_ids=[0])),
        Prefill("fault", row=3, params=SamplingParams(seed=4, bad_words=[[]])),
    ]
    step = client.sample(x, reqs)
    y = x.copy()
    y[0, 3] += np.float32(2.5)
    y[0, 10] -= np.float32(1.0)
    keep = np.full(64, -np.inf, dtype=np.float32)
    keep[[4, 8, 15]] = 0
    y[1] += keep
    y[2, [1, 2, 5, 0]] = -np.inf  # 1: the history ends with 9; 2: with 6, 9; 0: 2 < min_tokens
    want = log_softmax(y)
    for i, name in enumerate(["bias", "allowed", "bad"]):
        r = step[name]
        ids, lps = r.top_token_ids[0], r.top_logprobs[0]
        got = {int(t): float(lp) for t, lp in zip(ids, lps) if t >= 0 and np.isfinite(lp)}
        assert set(got) == set(np.flatnonzero(np.isfinite(want[i]))), name
        for t, lp in got.items():
            assert abs(lp - want[i][t]) <= 1e-5, (name, t)
    assert step["fault"].code == grpc.StatusCode.INVALID_ARGUMENT
    assert "params.bad_words[0].token_ids" in step["fault"].message


def test_decode_accept_counts(client):
    # Drafts equal to each row's argmax under greedy verification: all accepted, plus one.
    rows = 4
    x = logits(4, rows=rows)
    drafts = [int(np.argmax(x[j])) for j in range(rows - 1)]
    draft_lp = log_softmax(x[:rows - 1]).astype(np.float32)
    req = Decode("d0", first_row=0, num_rows=rows, draft_token_ids=drafts,
                 draft_logprobs=draft_lp, sample_position=3,
                 params=SamplingParams(top_k=1, seed=5, top_logprobs=2))
    r = client.sample(x, [req])["d0"]
    assert r.num_accepted == rows - 1
    assert r.token_ids.tolist() == drafts + [int(np.argmax(x[rows - 1]))]
    assert r.top_token_ids.shape == (rows, 2)
    # A draft the target cannot produce (removed by top_k = 1) is rejected at once.
    req.draft_token_ids = [int(np.argmin(x[0]))] + drafts[1:]
    r = client.sample(x, [req])["d0"]
    assert r.num_accepted == 0 and r.token_ids.tolist() == [int(np.argmax(x[0]))]


def test_decode_with_top_n_drafts_answers_as_the_same_dense_drafts(client):
    """draft_topn = (values, token_ids): q over the listed tokens, -inf elsewhere, as a dense
    row holding the same values would send it."""
    rows, n = 4, 5
    x = logits(6, rows=rows)
    draft_lp = log_softmax(x[:rows - 1] * 1.5).astype(np.float32)
    ids = np.argsort(-draft_lp, axis=1, kind="stable")[:, :n].astype(np.int32)
    values = np.take_along_axis(draft_lp, ids, axis=1)
    dense = np.full_like(draft_lp, -np.inf)
    np.put_along_axis(dense, ids, values, axis=1)
    drafts = ids[:, 1].tolist()  # second choices: some accepted, some not
    common = dict(first_row=0, num_rows=rows, draft_token_ids=drafts, sample_position=8,
                  params=SamplingParams(seed=11, top_logprobs=2))
    msg = client.build(x, [Decode("t", draft_topn=(values, ids), **common)])
    assert list(msg.inputs.requests[0].draft_topn.token_ids) == ids.reshape(-1).tolist()
    top = client.sample(x, [Decode("t", draft_topn=(values, ids), **common)])["t"]
    whole = client.sample(x, [Decode("t", draft_logprobs=dense, **common)])["t"]
    assert top.token_ids.tolist() == whole.token_ids.tolist()
    assert top.num_accepted == whole.num_accepted
    np.testing.assert_array_equal(top.logprobs, whole.logprobs)


def test_top_n_sigma_xtc_and_raw_logprobs(client):
    """SPEC 3 step 4's and step 8's worked examples through the client, and RAW logprobs equal
    to numpy's log_softmax of the logits as sent while the draw stays processed. Every
    backend lists and serves all three."""
    x = np.array([[4, 2, 2, 0]], dtype=np.float32)
    features = client.server_info().features
    assert {"top_n_sigma", "xtc", "raw_logprobs"} <= set(features)
    r = client.sample(x, [Prefill("s", row=0, params=SamplingParams(
        top_n_sigma=1.0, top_logprobs=4, seed=1))])["s"]
    assert r.top_token_ids[0].tolist() == [0, -1, -1, -1]
    p = np.log(np.array([[0.5, 0.3, 0.15, 0.05]], dtype=np.float32))
    r = client.sample(p, [Prefill("x", row=0, params=SamplingParams(
        xtc_probability=1.0, xtc_threshold=0.1, top_logprobs=4, seed=1))])["x"]
    assert r.top_token_ids[0].tolist() == [2, 3, -1, -1]
    np.testing.assert_allclose(r.top_logprobs[0][:2], np.log([0.75, 0.25]), atol=1e-6)
    y = logits(8)
    params = dict(temperature=0.5, top_k=3, top_logprobs=5)
    raw = client.sample(y, prefill(**params, logprobs_mode="raw"))
    processed = client.sample(y, prefill(**params))
    ref = log_softmax(y)
    for i, (a, b) in enumerate(zip(raw, processed)):
        assert a.token_ids.tolist() == b.token_ids.tolist()
        order = np.argsort(-y[i], kind="stable")[:5]
        assert a.top_token_ids[0].tolist() == order.tolist()
        np.testing.assert_allclose(a.top_logprobs[0], ref[i][order], atol=1e-5)
        np.testing.assert_allclose(a.logprobs, ref[i][a.token_ids], atol=1e-5)
    with pytest.raises(ValueError):
        client.build(y, prefill(logprobs_mode="log"))


def test_example_decode_loop_runs(server):
    example = pathlib.Path(__file__).resolve().parents[3] / "examples" / "decode_loop.py"
    lines = [l for l in example.read_text().splitlines() if l.strip() and not l.lstrip().startswith("#")]
    assert len(lines) < 30, f"the example is {len(lines)} lines of code"
    out = subprocess.run([sys.executable, str(example), server.target], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "generated 32 tokens" in out.stdout, out.stdout


def test_sampling_params_changes_reach_the_next_request():
    """SamplingParams caches its encoded scalars (issue 29): an assignment, and a token list
    or bias changed in place, must still reach the next request built from it."""
    params = SamplingParams(temperature=0.5, seed=3)
    first = samplerd.pb.SamplingParams()
    params.fill(first)
    params.temperature = 0.25
    second = samplerd.pb.SamplingParams()
    params.fill(second)
    assert (first.temperature, second.temperature, second.seq_seed) == (0.5, 0.25, 3)
    params.stop_token_ids = [1]
    params.stop_token_ids.append(7)
    params.logit_bias = {4: 1.0}
    params.logit_bias[5] = 2.0
    third = samplerd.pb.SamplingParams()
    params.fill(third)
    assert list(third.stop_token_ids) == [1, 7]
    assert dict(third.logit_bias) == {4: 1.0, 5: 2.0}
    assert third.temperature == 0.25


def test_client_and_server_versions_are_the_repositorys(server):
    """One VERSION file: samplerd reports it (GetServerInfo) and the client was built with it."""
    import pathlib
    want = (pathlib.Path(__file__).resolve().parents[3] / "VERSION").read_text().strip()
    with samplerd.SamplerClient(server.target) as client:
        assert client.server_info().version == want
    assert samplerd.__version__ == want
