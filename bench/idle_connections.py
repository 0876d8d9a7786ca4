#!/usr/bin/env python3
"""What idle connections cost samplerd: opens N TCP connections that never send a byte, then
prints samplerd's RSS and descriptors, whether health still answers (from this uid), and how
many connections the server kept (a kept one receives the server's HTTP/2 SETTINGS frame; a
refused one is closed at accept: --max_connections, --max_connections_per_uid).

    bazel build //server:samplerd
    ulimit -n 20000
    bazel-bin/server/samplerd --listen=127.0.0.1:0 --port_file=/tmp/port &
    python3 bench/idle_connections.py --port=$(head -1 /tmp/port) --pid=$! --connections=15000
"""
import argparse
import os
import socket
import subprocess
import time


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--pid", type=int, required=True, help="samplerd's pid")
    parser.add_argument("--connections", type=int, default=15000)
    parser.add_argument("--grpcurl", default=os.path.join(os.path.dirname(__file__), "..", "..",
                                                          "shared", "tools", "grpcurl"))
    args = parser.parse_args()
    before = rss_kib(args.pid)
    print(f"before: RSS {before / 1024:.1f} MiB, {len(os.listdir(f'/proc/{args.pid}/fd'))} descriptors")
    sockets = []
    for i in range(args.connections):
        s = socket.socket()
        try:
            s.connect(("127.0.0.1", args.port))
        except OSError as e:
            print(f"connect {i} failed: {e}")
            break
        sockets.append(s)
    time.sleep(2)
    kept = 0
    for s in sockets:
        s.setblocking(False)
        try:
            kept += len(s.recv(1, socket.MSG_PEEK)) == 1
        except OSError:  # nothing yet (BlockingIOError) or reset: not kept
            pass
    after = rss_kib(args.pid)
    print(f"{len(sockets)} idle connections, {kept} kept by samplerd: RSS {after / 1024:.1f} MiB "
          f"(+{(after - before) / 1024:.1f}), {len(os.listdir(f'/proc/{args.pid}/fd'))} descriptors")
    if os.path.exists(args.grpcurl):
        health = subprocess.run([args.grpcurl, "-plaintext", "-max-time", "5",
                                 f"127.0.0.1:{args.port}", "grpc.health.v1.Health/Check"],
                                capture_output=True, text=True)
        print("health from this uid:", "answered" if health.returncode == 0
              else "refused: " + health.stderr.strip()[:120])
    for s in sockets:
        s.close()


if __name__ == "__main__":
    main()
