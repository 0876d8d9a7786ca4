"""Context-parallel groups from Python, where no GPU is needed: the follower's packet reader
against the documented layout (sampler/group_packet.h), the group rpcs' errors on the CPU
backend, and NCCL logits refused there. The NCCL paths run on GPUs (examples/cp_decode_loop.py,
tests/multi_gpu_group_test)."""
import grpc
import numpy as np
import pytest

import samplerd
from samplerd.follower import FollowerStep, packet_words, unpack


def test_unpack_reads_the_documented_layout():
    words = np.zeros(packet_words(8), dtype=np.int32)
    words[:8] = [0x50474453, 1, np.int32(np.uint32(0x9ABCDEF0)), 7, 0, 3, 5, 0]
    words[8:17] = [0, 2, 3, 3, 0, 0, 0, 0, 2]   # per request: status, accepted, n
    words[17:22] = [5, 6, 7, 0, 41]               # the tokens
    step = unpack(words)
    assert isinstance(step, FollowerStep)
    assert step.step_id == (7 << 32) | 0x9ABCDEF0 and step.status_code == 0 and not step.closing
    assert [r.token_ids.tolist() for r in step.requests] == [[5, 6, 7], [], [0, 41]]
    assert [r.num_accepted for r in step.requests] == [2, 0, 0]
    assert step.requests[1].status_code == 3
    closing = np.zeros(packet_words(8), dtype=np.int32)
    closing[:8] = [0x50474453, 1, 0, 0, 14, 0, 0, 1]
    assert unpack(closing).closing and unpack(closing).status_code == 14
    bad = words.copy()
    bad[6] = 1 << 20
    with pytest.raises(ValueError):
        unpack(bad)
    bad = words.copy()
    bad[1] = 2
    with pytest.raises(ValueError, match="version"):
        unpack(bad)


def test_groups_need_the_cuda_backend(client):
    if client.server_info().backend != "cpu":
        pytest.skip("this checks the CPU backend's answer")
    with pytest.raises(samplerd.SamplerError) as e:
        client.create_group(world_size=2, max_step_tokens=16)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION and "CUDA backend" in e.value.message
    assert client.groups() == []
    with pytest.raises(samplerd.SamplerError) as e:
        client.destroy_group("cp1-00000000")
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    # A step naming a group that does not exist, by group_id or by NCCL logits.
    with pytest.raises(samplerd.SamplerError) as e:
        client.sample(np.zeros((1, 8), np.float32), [samplerd.Prefill("r", row=0)], group_id="cp9-x")
    assert e.value.code == grpc.StatusCode.NOT_FOUND and "group_id" in e.value.message
    with pytest.raises(samplerd.SamplerError) as e:
        client.sample(samplerd.NcclLogits("cp9-x", 1, rows=1, cols=8), [samplerd.Prefill("r", row=0)])
    assert e.value.code == grpc.StatusCode.NOT_FOUND and "logits.nccl.group_id" in e.value.message


def test_a_group_of_one_on_the_gpu(client):
    """On the CUDA backend (GPU machine): a group whose only rank is samplerd joins at once;
    its steps answer exactly what the same steps without a group answer; DestroyGroup removes
    it; a group whose follower never joins fails at its join timeout."""
    if client.server_info().backend != "cuda":
        pytest.skip("needs samplerd on the CUDA backend")
    import time

    group = client.create_group(world_size=1, max_step_tokens=64, device_id=0)
    assert group.layout_version == 1 and len(group.nccl_unique_id) == 128
    assert group.packet_bytes == 4 * packet_words(64)
    for _ in range(2000):
        if client.groups()[0].state == samplerd.pb.READY:
            break
        time.sleep(0.005)
    assert client.groups()[0].state == samplerd.pb.READY
    rng = np.random.default_rng(3)
    for s in range(20):
        x = rng.normal(0, 2, (4, 5000)).astype(np.float32)
        reqs = [samplerd.Prefill(f"r{i}", row=i, sample_position=s,
                                 params=samplerd.SamplingParams(temperature=0.8, seed=i)) for i in range(4)]
        grouped = client.sample(x, reqs, step_id=s, group_id=group.group_id)
        plain = client.sample(x, reqs, step_id=s)
        assert [r.token_ids.tolist() for r in grouped] == [r.token_ids.tolist() for r in plain]
        assert grouped.proto.timing.group_us >= 0
    assert client.groups()[0].steps == 20
    client.destroy_group(group.group_id)
    assert client.groups() == []

    lonely = client.create_group(world_size=2, max_step_tokens=8, device_id=0, join_timeout_ms=300)
    for _ in range(2000):
        if client.groups()[0].state != samplerd.pb.JOINING:
            break
        time.sleep(0.005)
    info = client.groups()[0]
    assert info.state == samplerd.pb.FAILED and "join timed out" in info.error
    with pytest.raises(samplerd.SamplerError) as e:
        client.sample(np.zeros((1, 8), np.float32), [samplerd.Prefill("r", row=0)],
                      group_id=lonely.group_id)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    client.destroy_group(lonely.group_id)
