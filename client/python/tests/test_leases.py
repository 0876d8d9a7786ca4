"""Registrations belong to the client that made them and end with it (issue 26): the client
unlinks a region's shm name once samplerd has it, keeps its registrations alive by itself,
and a killed worker's region is released within the lease plus a second."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import grpc
import pytest

import samplerd
from conftest import Server

LEASE_MS = 1000


@pytest.fixture(scope="module")
def lease_server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("samplerd"), f"--registration_lease_ms={LEASE_MS}")
    yield s
    assert s.stop() == 0


def test_registered_shm_is_unlinked_and_owned_by_its_client(lease_server):
    with samplerd.SamplerClient(lease_server.target, client_id="lease-a") as client:
        client.wait_ready()
        with samplerd.ShmRegion(4096) as region:
            client.register_shm(region, "owned")
            assert not os.path.exists("/dev/shm" + region.name)
            [info] = client.list_buffers()
            assert (info.name, info.owner) == ("owned", f"uid:{os.geteuid()}/id:lease-a")
            reply = client.keep_alive()
            assert (reply.lease_ms, reply.buffers) == (LEASE_MS, 1)
            client.unregister("owned")


def test_an_idle_client_stays_registered_by_its_keepalive(lease_server):
    with samplerd.SamplerClient(lease_server.target, client_id="lease-b") as client:
        client.wait_ready()
        with samplerd.ShmRegion(4096) as region:
            client.register_shm(region, "idle")
            time.sleep(2.5 * LEASE_MS / 1000)  # no call of ours: only the keep-alive thread
            assert [b.name for b in client.list_buffers()] == ["idle"]
            client.unregister("idle")


WORKER = textwrap.dedent("""
    import sys, time
    import numpy as np
    import samplerd
    target, shm_name, client_id, buffer = sys.argv[1], sys.argv[2], sys.argv[3] or None, sys.argv[4]
    client = samplerd.SamplerClient(target, client_id=client_id)
    client.wait_ready()
    region = samplerd.ShmRegion(64 << 20, name=shm_name)  # O_EXCL: a leftover name fails here
    logits = region.ndarray((4, 1 << 12))
    logits[:] = np.linspace(0.0, 1.0, 1 << 12, dtype=np.float32)
    started = time.monotonic()
    client.register_shm(region, buffer)
    waited = time.monotonic() - started
    client.sample(samplerd.ShmLogits(region, logits),
                  [samplerd.Prefill("r", row=0, params=samplerd.SamplingParams(seed=1))])
    print(f"READY {waited:.3f}", flush=True)
    time.sleep(600)
""")


def _spawn(target, shm_name, client_id="", buffer="py-pool"):
    worker = subprocess.Popen([sys.executable, "-c", WORKER, target, shm_name, client_id, buffer],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = worker.stdout.readline().split()
    if not line or line[0] != "READY":
        worker.kill()
        raise AssertionError(f"worker failed: {worker.communicate()[1][-2000:]}")
    return worker, float(line[1])


def _name_taken(client, name):
    """Whether samplerd holds `name` for some client: another client's regions are not listed
    (issue 45), but its name cannot be taken while it is alive."""
    with samplerd.ShmRegion(4096) as probe:
        try:
            client._call("RegisterBuffer", samplerd.pb.RegisterBufferRequest(
                name=name, kind=samplerd.pb.HOST_SHM, shm_name=probe.name, byte_size=4096))
        except samplerd.SamplerError as e:
            if e.code == grpc.StatusCode.ALREADY_EXISTS:
                return True
            raise
        client.unregister(name)
        return False


def test_a_killed_worker_is_released_within_the_lease(lease_server):
    shm_name = f"/pytest-lease-{os.getpid()}"
    with samplerd.SamplerClient(lease_server.target, client_id="lease-watch") as watcher:
        watcher.wait_ready()
        assert not _name_taken(watcher, "py-pool")
        worker, _ = _spawn(lease_server.target, shm_name)
        assert _name_taken(watcher, "py-pool")
        assert watcher.list_buffers() == []  # not the watcher's
        killed = time.monotonic()
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        while _name_taken(watcher, "py-pool") and time.monotonic() - killed < LEASE_MS / 1000 + 1:
            time.sleep(0.01)
        assert not _name_taken(watcher, "py-pool")


@pytest.mark.parametrize("stable_id", [False, True])
def test_a_worker_restarted_at_once_registers_and_leaves_no_name(lease_server, stable_id):
    """Issue 45: a worker sampling with unary calls is SIGKILLed and its replacement starts at
    once under the same shm name and buffer name. It used to get ALREADY_EXISTS (the dead
    owner's lease still ran), leave its shm name behind, and every later replacement died on
    FileExistsError: 1 of 5 rounds registered. Now each registers: a random client id waits
    for the dead owner's lease (samplerd says how long), a stable one takes over at once."""
    shm_name = f"/pytest-restart-{os.getpid()}-{int(stable_id)}"
    client_id = "worker-0" if stable_id else ""
    waits = []
    for _ in range(5):
        worker, waited = _spawn(lease_server.target, shm_name, client_id,
                                buffer=f"restart-pool-{int(stable_id)}")
        waits.append(waited)
        assert not os.path.exists("/dev/shm" + shm_name)  # unlinked once registered
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    assert not os.path.exists("/dev/shm" + shm_name)
    # The first had nothing to wait for; a stable id never waits a lease, a random one does
    # (at most the lease and the retry's slack).
    assert waits[0] < 0.5
    assert max(waits) < (0.5 if stable_id else LEASE_MS / 1000 + 0.5), waits
    if not stable_id:
        assert max(waits[1:]) > 0.1, waits  # it did wait out the predecessor's lease
    print(f"\nrestarted workers ({'stable' if stable_id else 'random'} client id): "
          f"registration waited {', '.join(f'{w * 1000:.0f}' for w in waits)} ms")


def test_a_failed_registration_leaves_no_name(lease_server):
    with samplerd.SamplerClient(lease_server.target, client_id="lease-holder") as holder, \
            samplerd.SamplerClient(lease_server.target, client_id="lease-c",
                                   reconnect_timeout=0) as client:
        holder.wait_ready()
        client.wait_ready()
        with samplerd.ShmRegion(4096) as held, holder.stream():
            holder.register_shm(held, "held")
            region = samplerd.ShmRegion(4096)
            with pytest.raises(samplerd.SamplerError) as refused:
                client.register_shm(region, "held")
            assert refused.value.code == grpc.StatusCode.ALREADY_EXISTS
            assert "lease-holder" not in refused.value.message  # owner ids are not public
            assert not os.path.exists("/dev/shm" + region.name)
            region.close()
            holder.unregister("held")
