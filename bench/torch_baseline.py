#!/usr/bin/env python3
"""PyTorch baseline for bench/gpu_bench: the same work done the usual way on the GPU.

Per step: temperature, a stable descending sort, softmax and cumsum for top-p, the top-k mask,
log_softmax of what is kept, top-5 logprobs, and a seeded inverse-CDF draw (torch.rand from a
seeded generator + searchsorted). V = 129,280, T = 0.7, top_p = 0.95, top_k = 50. Median of 50
timed steps after 5 warm-ups, CUDA events.
"""
import torch

V = 129280


def step(x, gen, T=0.7, top_p=0.95, top_k=50):
    s = x.float() / T
    sorted_s, idx = torch.sort(s, dim=-1, descending=True, stable=True)
    probs = torch.softmax(sorted_s, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs
    remove = before > top_p
    remove[:, top_k:] = True
    lp = torch.log_softmax(sorted_s.masked_fill(remove, float("-inf")), dim=-1)
    top5 = lp[:, :5]
    u = torch.rand((x.shape[0], 1), generator=gen, device=x.device, dtype=torch.float64)
    cdf = torch.cumsum(lp.double().exp(), dim=-1)
    pos = torch.searchsorted(cdf, u).clamp(max=V - 1)
    return idx.gather(1, pos), lp.gather(1, pos), top5


def time_rows(rows, dtype):
    x = torch.randn(rows, V, device="cuda", dtype=torch.float32).mul_(2.0).to(dtype)
    gen = torch.Generator(device="cuda").manual_seed(1)
    for _ in range(5):
        step(x, gen)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(50):
        start.record()
        step(x, gen)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1000.0)
    times.sort()
    return times[len(times) // 2]


def main():
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    print(f"{'config':22s} {'torch us':>12s}")
    for dtype, tag in ((torch.float32, ""), (torch.bfloat16, " bf16")):
        for rows in (1, 16, 384, 8192):
            print(f"{('rows=' + str(rows) + tag):22s} {time_rows(rows, dtype):12.1f}")


if __name__ == "__main__":
    main()
