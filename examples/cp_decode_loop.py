"""A context-parallel (CP = 2) decode loop: rank 0 (the driver, GPU 0) talks gRPC to samplerd;
rank 1 (GPU 1) never does: it receives each step's tokens by NCCL broadcast from samplerd, as
it needs them for its share of the next forward pass. Needs two GPUs and samplerd on the CUDA
backend on GPU 0 (samplerd --backend=cuda --cuda_device=0).

    python3 examples/cp_decode_loop.py 127.0.0.1:50051
"""
import multiprocessing as mp
import sys
import time

import numpy as np

import samplerd

BATCH, VOCAB, STEPS = 4, 32000, 16


def follower(unique_id, out):
    from samplerd.follower import GroupFollower
    rank1 = GroupFollower(unique_id, world_size=2, rank=1, device=1, max_step_tokens=BATCH)
    tokens = []
    while not (step := rank1.receive_step()).closing:       # one packet per driver step
        tokens.append([r.token_ids.tolist() for r in step.requests])
    out.put(tokens)


if __name__ == "__main__":
    client = samplerd.SamplerClient(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:50051")
    group = client.create_group(world_size=2, max_step_tokens=BATCH, device_id=0)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    rank1 = ctx.Process(target=follower, args=(group.nccl_unique_id, out))
    rank1.start()
    while client.groups()[0].state != samplerd.pb.READY:       # until rank 1 joined
        time.sleep(0.01)
    rng, driver_tokens = np.random.default_rng(0), []
    for position in range(STEPS):
        step = client.sample(rng.normal(0, 3, (BATCH, VOCAB)).astype(np.float32),
                             [samplerd.Prefill(f"seq{i}", row=i, sample_position=position,
                                               params=samplerd.SamplingParams(temperature=0.8, seed=i))
                              for i in range(BATCH)], group_id=group.group_id)
        driver_tokens.append([r.token_ids.tolist() for r in step])
    client.destroy_group(group.group_id)                        # rank 1 gets the closing packet
    assert out.get(timeout=60) == driver_tokens, "rank 1 saw other tokens than rank 0"
    rank1.join()
    print(f"CP=2: {STEPS} steps; rank 1 received the same {BATCH * STEPS} tokens by broadcast")
