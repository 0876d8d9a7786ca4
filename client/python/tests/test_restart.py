"""samplerd restarts under a live worker (issue 26): the blocking and asyncio clients register
their regions again and resend unanswered steps by themselves, so a decode loop written with
no code for restarts survives samplerd being killed (SIGKILL) before a step, during one, with
steps pipelined, and drained (SIGTERM, a rollout). Every answer must equal the one a samplerd
that never restarted gives for the same step with the logits inline (exact: the CPU backend is
deterministic), and /dev/shm must hold no name of the region afterwards."""
import asyncio
import os
import signal
import threading
import time

import numpy as np
import pytest

import samplerd
from conftest import Server

ROWS, VOCAB, SLOTS = 4, 2048, 4


def logits(step):
    return np.random.default_rng(1000 + step).normal(0, 2, (ROWS, VOCAB)).astype(np.float32)


def requests(step):
    return [samplerd.Prefill(f"r{r}", row=r, sample_position=100 + step,
                             params=samplerd.SamplingParams(seed=7 + r, temperature=0.9,
                                                            top_p=0.95, top_logprobs=3))
            for r in range(ROWS)]


def answer(result):
    return [(r.token_ids.tolist(), r.logprobs.tolist(), r.top_token_ids.tolist())
            for r in result]


@pytest.fixture(scope="module")
def reference(server):
    """The answers of a samplerd that never restarts, inline logits."""
    with samplerd.SamplerClient(server.target) as client:
        client.wait_ready()
        return {s: answer(client.sample(logits(s), requests(s), step_id=s + 1))
                for s in range(40)}


class Restartable:
    def __init__(self, tmp):
        self.tmp = tmp
        self.server = Server(tmp, "--registration_lease_ms=900", unix_socket=True)
        self.target = self.server.target

    def kill(self):
        self.server.proc.send_signal(signal.SIGKILL)
        self.server.proc.wait()
        self.server.log.close()

    def start(self):
        self.server = Server(self.tmp, "--registration_lease_ms=900", unix_socket=True)

    def restart_later(self, delay_s, how=signal.SIGKILL):
        """After delay_s, on a thread: stops samplerd by `how` (None: it is already gone) and
        starts a new one."""
        def run():
            time.sleep(delay_s)
            if how == signal.SIGKILL:
                self.kill()
            elif how == signal.SIGTERM:
                assert self.server.stop() == 0  # a drain: every step it read is answered
            self.start()
        thread = threading.Thread(target=run)
        thread.start()
        return thread


def shm_names(prefix):
    return [n for n in os.listdir("/dev/shm") if n.startswith(prefix.lstrip("/"))]


def write_step(region, step):
    view = region.ndarray((ROWS, VOCAB), byte_offset=(step % SLOTS) * ROWS * VOCAB * 4)
    view[:] = logits(step)
    return samplerd.ShmLogits(region, view)


def test_blocking_decode_loop_survives_restarts(tmp_path, reference):
    samplerd_ = Restartable(tmp_path)
    prefix = f"/samplerd-pyrestart-{os.getpid()}"
    # Not a `with`: a failed assertion's traceback keeps views alive, and close() would then
    # hide the failure behind a BufferError.
    region = samplerd.ShmRegion(SLOTS * ROWS * VOCAB * 4, name=prefix)
    with samplerd.SamplerClient(samplerd_.target, reconnect_timeout=20) as client:
        client.wait_ready()
        client.register_shm(region, "decode-logits")
        with client.stream() as stream:
            for s in range(30):
                restart = None
                if s == 10:  # killed before the step, back 300 ms later
                    samplerd_.kill()
                    restart = samplerd_.restart_later(0.3, how=None)
                elif s == 20:  # killed while the step is in flight
                    restart = samplerd_.restart_later(0.0002)
                got = stream.step(write_step(region, s), requests(s), step_id=s + 1)
                if restart:
                    restart.join()
                assert answer(got) == reference[s], f"step {s}"
            # Four steps pipelined, then a rollout (SIGTERM drain, then a new samplerd).
            for s in range(30, 34):
                stream.send(client.build(write_step(region, s), requests(s), step_id=s + 1))
            samplerd_.restart_later(0, signal.SIGTERM).join()
            for s in range(30, 34):
                assert answer(stream.recv()) == reference[s], f"step {s}"
        # A unary step after a kill.
        samplerd_.restart_later(0).join()
        got = answer(client.sample(write_step(region, 34), requests(34), step_id=35))
        assert got == reference[34]
        [info] = client.list_buffers()
        assert (info.name, info.owner) == ("decode-logits", f"uid:{os.geteuid()}/id:{client.client_id}")
        assert shm_names(prefix) == []
        client.unregister("decode-logits")
    region.close()
    assert samplerd_.server.stop() == 0


def test_asyncio_decode_loop_survives_restarts(tmp_path, reference):
    samplerd_ = Restartable(tmp_path)
    prefix = f"/samplerd-pyrestart-a{os.getpid()}"

    async def loop():
        async with samplerd.AsyncSamplerClient(samplerd_.target, reconnect_timeout=20) as client:
            region = samplerd.ShmRegion(SLOTS * ROWS * VOCAB * 4, name=prefix)
            if True:
                await client.register_shm(region, "decode-logits")
                async with client.stream() as stream:
                    for s in range(30):
                        restart = None
                        if s == 10:
                            samplerd_.kill()
                            restart = samplerd_.restart_later(0.3, how=None)
                        elif s == 20:
                            restart = samplerd_.restart_later(0.0002)
                        got = await stream.step(write_step(region, s), requests(s),
                                                step_id=s + 1)
                        if restart:
                            await asyncio.get_running_loop().run_in_executor(None, restart.join)
                        assert answer(got) == reference[s], f"step {s}"
                samplerd_.restart_later(0).join()
                got = await client.sample(write_step(region, 34), requests(34), step_id=35)
                assert answer(got) == reference[34]
                assert shm_names(prefix) == []
                await client.unregister("decode-logits")
            region.close()

    asyncio.run(loop())
    assert samplerd_.server.stop() == 0


def test_rollout_between_steps_keeps_the_unread_answer(tmp_path, reference):
    """A rollout while the worker is between steps, with an answer it has not read: the
    draining samplerd ends the waiting stream at once rather than at its shutdown deadline
    (30 s here), and the next step goes to the next samplerd."""
    samplerd_ = Restartable(tmp_path)
    samplerd_.server.stop()
    samplerd_.server = Server(tmp_path, "--shutdown_deadline_ms=30000", unix_socket=True)
    region = samplerd.ShmRegion(SLOTS * ROWS * VOCAB * 4, name=f"/samplerd-pyroll-{os.getpid()}")
    with samplerd.SamplerClient(samplerd_.target, reconnect_timeout=20) as client:
        client.wait_ready()
        client.register_shm(region, "decode-logits")
        with client.stream() as stream:
            stream.send(client.build(write_step(region, 0), requests(0), step_id=1))
            time.sleep(0.3)  # the answer arrives and stays unread
            start = time.monotonic()
            assert samplerd_.server.stop() == 0
            drained_s = time.monotonic() - start
            samplerd_.start()
            stream.send(client.build(write_step(region, 1), requests(1), step_id=2))
            assert answer(stream.recv()) == reference[0]
            assert answer(stream.recv()) == reference[1]
        assert drained_s < 10, f"the drain waited {drained_s:.1f} s for the idle stream"
    region.close()
    assert samplerd_.server.stop() == 0


def test_a_client_that_does_not_wait_fails_at_once(tmp_path):
    samplerd_ = Restartable(tmp_path)
    with samplerd.SamplerClient(samplerd_.target, reconnect_timeout=0) as client:
        client.wait_ready()
        client.sample(logits(0), requests(0))
        samplerd_.kill()
        start = time.monotonic()
        with pytest.raises(samplerd.SamplerError) as failed:
            client.sample(logits(0), requests(0))
        assert failed.value.code.name == "UNAVAILABLE"
        assert time.monotonic() - start < 5
