"""Registrations belong to the client that made them and end with it (issue 26): the client
unlinks a region's shm name once samplerd has it, keeps its registrations alive by itself,
and a killed worker's region is released within the lease plus a second."""
import os
import signal
import subprocess
import sys
import textwrap
import time

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
            assert (info.name, info.owner) == ("owned", "id:lease-a")
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
    import samplerd
    client = samplerd.SamplerClient(sys.argv[1])
    client.wait_ready()
    region = samplerd.ShmRegion(16 << 20)
    region.ndarray((4 << 20,))[:] = 1.0  # every page there
    client.register_shm(region, "py-pool")
    print("READY", flush=True)
    time.sleep(600)
""")


def test_a_killed_worker_is_released_within_the_lease(lease_server):
    with samplerd.SamplerClient(lease_server.target, client_id="lease-watch") as watcher:
        watcher.wait_ready()
        for _ in range(3):
            worker = subprocess.Popen([sys.executable, "-c", WORKER, lease_server.target],
                                      stdout=subprocess.PIPE, text=True)
            assert worker.stdout.readline().strip() == "READY"
            assert [b.name for b in watcher.list_buffers()] == ["py-pool"]
            killed = time.monotonic()
            worker.send_signal(signal.SIGKILL)
            worker.wait()
            while watcher.list_buffers() and time.monotonic() - killed < LEASE_MS / 1000 + 1:
                time.sleep(0.01)
            assert watcher.list_buffers() == []
            # The next worker registers the same name: the loop's next round.
