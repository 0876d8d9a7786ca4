"""A model worker's decode loop with samplerd: logits in shared memory, one step stream.

    python3 examples/decode_loop.py 127.0.0.1:50051     (pip install ./client/python first)
"""
import sys

import numpy as np

import samplerd

BATCH, VOCAB = 8, 32000
client = samplerd.SamplerClient(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:50051")
region = samplerd.ShmRegion(BATCH * VOCAB * 4)       # the model writes its logits here
logits = region.ndarray((BATCH, VOCAB), np.float32)
client.register_shm(region)
history = [[] for _ in range(BATCH)]
rng = np.random.default_rng(0)
with client.stream() as stream:
    for position in range(32):
        logits[:] = rng.normal(0, 3, logits.shape)  # stands in for model.forward()
        step = stream.step(samplerd.ShmLogits(region, logits), [
            samplerd.Decode(f"seq{i}", first_row=i, num_rows=1, sample_position=position,
                            output_token_ids=history[i],
                            params=samplerd.SamplingParams(temperature=0.7, top_p=0.95,
                                                           repetition_penalty=1.1, seed=i))
            for i in range(BATCH)])
        for seq, result in zip(history, step):
            seq.extend(result.token_ids.tolist())     # raises if that request failed
client.unregister(region.name)
del logits
region.close()
print(f"generated {len(history[0])} tokens x {BATCH} sequences; seq0: {history[0][:8]}")
