"""The co-located step channel (issue 29) against a real samplerd: the same answers as the
SampleStream, bitwise; a step-level fault fails only its step; a killed worker's channel is
closed with its lease; a closed channel is dropped. The hostile header words and bytes are
server/step_channel_test's."""
import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

import urllib.request

import grpc
import numpy as np
import pytest

import samplerd
from conftest import Server
from samplerd import Decode, Prefill, SamplingParams

LEASE_MS = 1000
ROWS, VOCAB = 6, 1000


@pytest.fixture(scope="module")
def lease_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("samplerd")
    s = Server(tmp, f"--registration_lease_ms={LEASE_MS}", "--metrics_address=127.0.0.1:0")
    s.metrics_port = int((tmp / "port").read_text().split()[1])
    yield s
    assert s.stop() == 0


def steps(region, x):
    """A mix: PREFILL with prompt logprobs and adjustments, a request that fails alone
    (top_p 2), and DECODE with dense drafts, over shm and inline logits."""
    shm = samplerd.ShmLogits(region, x)
    yield shm, [Prefill(f"p{i}", row=i, sample_position=3, params=SamplingParams(
        seed=i, temperature=0.8, top_k=40, top_logprobs=5, logit_bias={5: 2.0}))
        for i in range(ROWS - 2)] + [
        Prefill("bad", row=ROWS - 2, params=SamplingParams(top_p=2.0, seed=9))], {}
    drafts = np.log(np.full((2, VOCAB), 1.0 / VOCAB, dtype=np.float32))
    yield x, [Decode("d", first_row=0, num_rows=3, sample_position=11, draft_token_ids=[4, 7],
                     draft_logprobs=drafts,
                     params=SamplingParams(seed=3, top_p=0.9, top_logprobs=3))], {}


def answers(results):
    return [(r.request_id, r.code, r.message) + ((r.token_ids.tolist(), r.logprobs.tolist(),
            r.top_token_ids.tolist(), r.top_logprobs.tolist()) if r.ok else ())
            for r in results]


def test_the_channel_answers_as_the_stream_bitwise(lease_server):
    with samplerd.SamplerClient(lease_server.target, client_id="chan-a") as client:
        client.wait_ready()
        region = samplerd.ShmRegion(ROWS * VOCAB * 4)
        x = region.ndarray((ROWS, VOCAB), np.float32)
        x[:] = np.random.default_rng(0).normal(0, 2, x.shape)
        client.register_shm(region)
        with client.stream() as stream, client.channel() as channel:
            for logits, requests, kw in steps(region, x):
                a = channel.step(logits, requests, step_id=5, **kw)
                b = stream.step(logits, requests, step_id=5, **kw)
                assert answers(a) == answers(b)
                assert a.step_id == 5
            assert a["d"].token_ids.size >= 1
        del x, logits, requests
        client.unregister(region.buffer_name)
        region.close()


def test_the_asyncio_channel_answers_as_the_blocking_one(lease_server):
    x = np.random.default_rng(3).normal(0, 2, (ROWS, VOCAB)).astype(np.float32)
    requests = [Prefill(f"a{i}", row=i, params=SamplingParams(seed=i, top_logprobs=2))
                for i in range(ROWS)]
    with samplerd.SamplerClient(lease_server.target, client_id="chan-d") as client:
        with client.channel() as channel:
            want = answers(channel.step(x, requests, step_id=1))

    async def run():
        async with samplerd.AsyncSamplerClient(lease_server.target, client_id="chan-e") as ac:
            async with await ac.channel() as channel:
                # Two steps one after the other, while the loop runs another task.
                ticks = asyncio.create_task(asyncio.sleep(0.01))
                got = [answers(await channel.step(x, requests, step_id=1)) for _ in range(2)]
                await ticks
                return got

    assert asyncio.run(run()) == [want, want]


def test_a_step_level_fault_fails_only_its_step(lease_server):
    with samplerd.SamplerClient(lease_server.target, client_id="chan-b") as client:
        client.wait_ready()
        with client.channel(capacity_bytes=64 << 10) as channel:
            region = samplerd.ShmRegion(4096)
            ghost = samplerd.ShmLogits(region, region.ndarray((1, 1000), np.float32))
            with pytest.raises(samplerd.SamplerError) as e:
                channel.step(ghost, [Prefill("r", row=0)])  # never registered
            assert e.value.code == grpc.StatusCode.NOT_FOUND
            with pytest.raises(samplerd.SamplerError) as e:  # larger than the channel
                channel.step(np.zeros((32, 1000), np.float32), [Prefill("r", row=0)])
            assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
            step = channel.step(np.zeros((1, 10), np.float32), [Prefill("r", row=0)])
            assert step["r"].token_ids.size == 1
            del ghost
            region.close()


def test_the_channel_polls_as_long_as_its_last_wait(lease_server):
    """The default poll follows the last step's wait (twice it, 0.5-5 ms), so a synchronous
    loop whose answer comes milliseconds after the send polls for it instead of paying the
    futex wake-up; a fixed spin_seconds stays fixed."""
    from samplerd.channel import _SPIN_MAX, _SPIN_MIN
    big = np.random.default_rng(5).normal(0, 2, (64, 32000)).astype(np.float32)
    requests = [Prefill(f"r{i}", row=i, params=SamplingParams(seed=i, top_logprobs=20))
                for i in range(64)]
    with samplerd.SamplerClient(lease_server.target, client_id="chan-f") as client:
        with client.channel(capacity_bytes=16 << 20) as channel, \
                client.channel(capacity_bytes=16 << 20, spin_seconds=1e-4) as fixed:
            assert channel.spin_budget() == _SPIN_MIN
            started = time.perf_counter()
            channel.step(big, requests)  # 8 MB inline, 64 rows: several ms on the CPU
            took = time.perf_counter() - started
            assert took > _SPIN_MAX / 2, took  # the premise: a wait longer than 2.5 ms
            assert channel.spin_budget() == _SPIN_MAX
            fixed.step(big, requests)
            assert fixed.spin_budget() == 1e-4


WORKER = textwrap.dedent("""
    import sys, time
    import numpy as np
    import samplerd
    client = samplerd.SamplerClient(sys.argv[1], client_id="chan-worker")
    channel = client.channel(capacity_bytes=1 << 16)
    channel.step(np.zeros((1, 10), np.float32), [samplerd.Prefill("r", row=0)])
    print("READY", flush=True)
    time.sleep(600)
""")


def log_text(server):
    server.log.flush()
    server.log.seek(0)
    return server.log.read()


def test_a_killed_workers_channel_is_closed_within_the_lease(lease_server):
    worker = subprocess.Popen([sys.executable, "-c", WORKER, lease_server.target],
                              stdout=subprocess.PIPE, text=True)
    assert worker.stdout.readline().strip() == "READY"
    killed = time.monotonic()
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    closed = f"closed 1 step channels of uid:{os.geteuid()}/id:chan-worker: lease_expired"
    while closed not in log_text(lease_server) and time.monotonic() - killed < LEASE_MS / 1000 + 2:
        time.sleep(0.02)
    assert closed in log_text(lease_server)
    # Nothing of it is left under /dev/shm: the client unlinked the name once samplerd had it.
    assert not [n for n in os.listdir("/dev/shm") if str(worker.pid) in n]


def open_channels(server) -> float:
    """samplerd_step_channels, scraped from the server's Prometheus endpoint."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics").read().decode()
    return float(next(line.split()[1] for line in text.splitlines()
                      if line.startswith("samplerd_step_channels ")))


def test_a_closed_channel_is_dropped(lease_server):
    with samplerd.SamplerClient(lease_server.target, client_id="chan-c") as client:
        client.wait_ready()
        before = open_channels(lease_server)
        channel = client.channel(capacity_bytes=1 << 16)
        assert open_channels(lease_server) == before + 1
        channel.close()
        with pytest.raises(samplerd.SamplerError) as e:
            channel.step(np.zeros((1, 10), np.float32), [Prefill("r", row=0)])
        assert e.value.code == grpc.StatusCode.CANCELLED
        # The reaper drops it (its thread has stopped and unmapped it) within a period.
        deadline = time.monotonic() + 3
        while open_channels(lease_server) != before and time.monotonic() < deadline:
            time.sleep(0.02)
        assert open_channels(lease_server) == before
        assert "closed step channels" in log_text(lease_server)
