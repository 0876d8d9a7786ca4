"""A Hugging Face model generates through samplerd (examples/hf_generate.py, hf_speculative.py),
checked against oracles nobody here wrote: transformers' own greedy `generate`, its logits
processors, and the rejection-sampling theorem.

Tiny Llamas at random weights, made here (no download); the real server on the CPU backend,
logits by shared memory. Each test prints what it found (run pytest with -s to see it).
"""
import dataclasses
import math
import pathlib
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import samplerd  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "examples"))
from hf_generate import generate, left_pad, tiny_llama  # noqa: E402
from hf_speculative import last_logits, speculative_generate  # noqa: E402

PROMPTS = [[1, 17, 42], [1, 5, 6, 7, 8, 9, 10], [3], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]]
# Greedy is SPEC's temperature 1e-5 draw: a runner-up within this of the top logit could be
# drawn, and the model's logits in our loop and in generate() may differ in the last bits.
# Such steps are near ties: found and reported, never counted as agreement or as failure.
NEAR_TIE = 1e-3


@pytest.fixture(scope="module")
def model():
    return tiny_llama(vocab=512, hidden=64, layers=2, seed=0, initializer_range=0.2)


def hf_greedy(model, prompts, max_new_tokens, eos=None):
    ids, mask, _ = left_pad(prompts, 0, model.device)
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                         max_new_tokens=max_new_tokens, output_logits=True,
                         return_dict_in_generate=True, eos_token_id=eos, pad_token_id=0)
    return out.sequences[:, ids.shape[1]:].tolist(), torch.stack(out.logits, dim=1)


def compare_greedy(ours, theirs, logits, eos=None):
    """(tokens compared, near ties met); fails on a difference that is not a near tie."""
    compared, ties = 0, []
    top2 = logits.topk(2, dim=-1).values
    gaps = (top2[..., 0] - top2[..., 1]).tolist()
    for s, (gen, ref) in enumerate(zip(ours, theirs)):
        if eos is not None and eos in ref:
            ref = ref[:ref.index(eos) + 1]
        for n, (a, b) in enumerate(zip(gen.tokens, ref)):
            if gaps[s][n] < NEAR_TIE:
                ties.append((s, n, gaps[s][n], a == b))
                if a != b:
                    break  # the sequences condition on different tokens from here on
                continue
            assert a == b, f"sequence {s} token {n}: samplerd {a}, generate {b} (gap {gaps[s][n]})"
            compared += 1
        else:
            assert len(gen.tokens) == len(ref), f"sequence {s}: {gen.tokens} vs {ref}"
    return compared, ties


def test_greedy_equals_generate(client, model):
    greedy = [samplerd.SamplingParams(temperature=0)] * len(PROMPTS)
    ours = generate(client, model, PROMPTS, greedy, max_new_tokens=24)
    theirs, logits = hf_greedy(model, PROMPTS, 24)
    compared, ties = compare_greedy(ours, theirs, logits)
    smallest = logits.topk(2).values.diff().abs().min()
    print(f"\ngreedy: {len(PROMPTS)} sequences x 24 tokens, {compared} equal, near ties "
          f"(gap < {NEAR_TIE}): {ties or 'none'}; smallest gap {smallest:.2e}")
    assert compared >= len(PROMPTS) * 24 - 24  # a near tie may cut one sequence short

    # Stop tokens: the third sequence's 5th token as EOS; both stop there, the rest run on.
    eos = theirs[2][4]
    ours = generate(client, model, PROMPTS, greedy, max_new_tokens=24, stop_token_ids=[eos])
    theirs, logits = hf_greedy(model, PROMPTS, 24, eos=eos)
    assert ours[2].tokens[-1] == eos and len(ours[2].tokens) <= 5
    compared, _ = compare_greedy(ours, theirs, logits, eos=eos)
    assert compared >= sum(len(g.tokens) for g in ours) - 24


def test_seeded_sampling_is_reproducible_and_batch_invariant(client, model):
    params = [samplerd.SamplingParams(temperature=0.9, top_p=0.9, seed=100 + i)
              for i in range(len(PROMPTS))]
    first = generate(client, model, PROMPTS, params, max_new_tokens=20)
    again = generate(client, model, PROMPTS, params, max_new_tokens=20)
    assert [g.tokens for g in first] == [g.tokens for g in again]
    # Each sequence alone, and the batch in reverse order: the same tokens. (The model's logits
    # for a sequence alone differ from its padded batch row in the last bits; a token could only
    # change where its draw lies within that of an interval edge.)
    for i, prompt in enumerate(PROMPTS):
        alone = generate(client, model, [prompt], [params[i]], max_new_tokens=20)
        assert alone[0].tokens == first[i].tokens, f"sequence {i} alone differs"
    reverse = generate(client, model, PROMPTS[::-1], params[::-1], max_new_tokens=20)
    assert [g.tokens for g in reverse[::-1]] == [g.tokens for g in first]
    # gRPC's stream instead of the step channel: the same answers.
    streamed = generate(client, model, PROMPTS, params, max_new_tokens=20, transport="stream")
    assert [(g.tokens, g.logprobs) for g in streamed] == [(g.tokens, g.logprobs) for g in first]
    # And a different seed gives a different sequence (the seed is really used).
    other = generate(client, model, PROMPTS[:1], [samplerd.SamplingParams(
        temperature=0.9, top_p=0.9, seed=999)], max_new_tokens=20)
    assert other[0].tokens != first[0].tokens


def test_array_steps_answer_as_request_objects(client, model, monkeypatch):
    """generate() sends a step as arrays (client.build_batch) when no sequence's parameters read
    its history, else one request object a sequence (issue 46). min_tokens = 1 with no stop ids
    changes no distribution but needs the history, so it takes the second form: both forms give
    the same tokens, logprobs and top lists; only the first goes through build_batch."""
    batches = []
    build_batch = client.build_batch
    monkeypatch.setattr(client, "build_batch",
                        lambda *a, **kw: batches.append(1) or build_batch(*a, **kw))
    arrays = [samplerd.SamplingParams(temperature=0.8, top_k=40, top_logprobs=1 + i % 3,
                                      seed=11 + i) for i in range(len(PROMPTS))]
    objects = [dataclasses.replace(p, min_tokens=1) for p in arrays]
    a = generate(client, model, PROMPTS, arrays, max_new_tokens=12)
    steps = len(batches)
    b = generate(client, model, PROMPTS, objects, max_new_tokens=12)
    assert steps >= 12 and len(batches) == steps  # every step of the first run, none of the second
    for x, y in zip(a, b):
        assert x.tokens == y.tokens
        assert x.logprobs == y.logprobs
        assert [u.tolist() for u in x.top_ids] == [v.tolist() for v in y.top_ids]
        assert [u.tolist() for u in x.top_logprobs] == [v.tolist() for v in y.top_logprobs]


def test_seeds_as_an_array_answer_as_each_sequences_params(client, model, monkeypatch):
    """Where the sequences' parameters differ only in their seeds, generate() sends one shared
    SamplingParams and the seeds as an array (RequestBatch.seq_seeds, encoded once a step):
    the same tokens, logprobs and top lists as each sequence's own parameters sent."""
    import hf_generate

    params = [samplerd.SamplingParams(temperature=0.8, top_k=40, top_p=0.9, top_logprobs=3,
                                      seed=21 + 5 * i) for i in range(len(PROMPTS))]
    shared = hf_generate._seeded(params)
    assert shared is not None and shared[1] == [p.seed for p in params]
    # Any other difference, or a sequence without a seed, keeps each one's own parameters.
    assert hf_generate._seeded(params[:1] + [dataclasses.replace(params[1], top_k=41)]) is None
    assert hf_generate._seeded(params[:1] + [dataclasses.replace(params[1], seed=None)]) is None
    seeded = generate(client, model, PROMPTS, params, max_new_tokens=12)
    monkeypatch.setattr(hf_generate, "_seeded", lambda params: None)
    own = generate(client, model, PROMPTS, params, max_new_tokens=12)
    for x, y in zip(seeded, own):
        assert x.tokens == y.tokens
        assert x.logprobs == y.logprobs
        assert [u.tolist() for u in x.top_ids] == [v.tolist() for v in y.top_ids]
        assert [u.tolist() for u in x.top_logprobs] == [v.tolist() for v in y.top_logprobs]
    # The seeds are really each sequence's: with them swapped, the tokens change.
    swapped = [dataclasses.replace(p, seed=params[-1 - i].seed) for i, p in enumerate(params)]
    other = generate(client, model, PROMPTS, swapped, max_new_tokens=12)
    assert [g.tokens for g in other] != [g.tokens for g in seeded]


def test_logprobs_match_transformers_processors(client, model):
    """Returned logprobs and top logprobs against log_softmax of the logits as transformers'
    own processors make them (repetition penalty, temperature, top-k: the same rules as SPEC 3;
    with no ties, the order of top-k and temperature does not matter), the logits from one full
    forward of the finished sequence (not our loop's KV-cache steps)."""
    from transformers import (RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper,
                              TopKLogitsWarper)

    prompts = [[1, 7, 7, 9, 7], [4, 4, 4]]
    params = [samplerd.SamplingParams(temperature=0.8, top_k=8, repetition_penalty=1.3,
                                      top_logprobs=5, seed=s) for s in (1, 2)]
    processors = [RepetitionPenaltyLogitsProcessor(1.3), TemperatureLogitsWarper(0.8),
                  TopKLogitsWarper(8)]
    worst = 0.0
    for prompt, gen in zip(prompts, generate(client, model, prompts, params, 12)):
        full = torch.tensor([prompt + gen.tokens])
        with torch.no_grad():
            logits = model(input_ids=full).logits[0].float()
        for n, token in enumerate(gen.tokens):
            scores = logits[len(prompt) + n - 1][None].clone()
            for p in processors:
                scores = p(full[:, :len(prompt) + n], scores)
            expected = torch.log_softmax(scores[0], dim=-1)
            top = expected.topk(5)
            assert expected[token] > -math.inf, "a token outside top-k was emitted"
            np.testing.assert_array_equal(gen.top_ids[n], top.indices.numpy())
            np.testing.assert_allclose(gen.top_logprobs[n], top.values.numpy(), atol=1e-4)
            np.testing.assert_allclose(gen.logprobs[n], expected[token].item(), atol=1e-4)
            worst = max(worst, abs(gen.logprobs[n] - expected[token].item()),
                        float(np.abs(gen.top_logprobs[n] - top.values.numpy()).max()))
    print(f"\nlogprobs: 2 sequences x 12 tokens x (token + top-5), largest difference {worst:.2e}")


def test_raw_logprobs_are_the_models_own_log_softmax(client, model):
    """logprobs_mode="raw" (SPEC 7): every reported logprob is torch.log_softmax of the model's
    own logits as sent, whatever the penalties, temperature, top-k, top-nσ and XTC did to the
    distribution the tokens are drawn from (what an RL rollout compares with its trainer)."""
    prompts = [[1, 7, 7, 9, 7], [4, 4, 4]]
    params = [samplerd.SamplingParams(temperature=0.8, top_k=8, repetition_penalty=1.3,
                                      top_n_sigma=1.5, xtc_probability=0.5, top_logprobs=5,
                                      logprobs_mode="raw", seed=s) for s in (1, 2)]
    worst = 0.0
    for prompt, gen in zip(prompts, generate(client, model, prompts, params, 12)):
        full = torch.tensor([prompt + gen.tokens])
        with torch.no_grad():
            logits = model(input_ids=full).logits[0].float()
        for n, token in enumerate(gen.tokens):
            expected = torch.log_softmax(logits[len(prompt) + n - 1], dim=-1)
            top = expected.topk(5)
            np.testing.assert_array_equal(gen.top_ids[n], top.indices.numpy())
            np.testing.assert_allclose(gen.top_logprobs[n], top.values.numpy(), atol=1e-4)
            np.testing.assert_allclose(gen.logprobs[n], expected[token].item(), atol=1e-4)
            worst = max(worst, abs(gen.logprobs[n] - expected[token].item()))
    print(f"\nraw logprobs: 2 sequences x 12 tokens, largest difference {worst:.2e}")


def chi_square_sf(x, df):
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(x / 2, dtype=torch.float64)))


@pytest.mark.parametrize("own_drafter", [False, True], ids=["draft-pool", "own-drafter"])
def test_speculative_decoding_emits_the_targets_distribution(client, own_drafter):
    """The rejection-sampling theorem (SPEC 6), end to end: a draft model proposes k = 3 tokens
    (DRAFT steps, its distributions kept in samplerd's pool; or, own-drafter, drawn by the
    worker, their distributions sent by handle from its shm region), the target verifies them
    (DECODE),
    and the first two emitted tokens (x1, x2) must be distributed as the target's own p(x1)
    p(x2 | x1), whichever path emitted them (accepted draft, replacement, or fresh draw).

    Test: Pearson's chi-square over the V^2 = 256 cells (cells expecting < 5 pooled), N = 4,000
    independent seeds, fail at p < 1e-4. Power: detects, 9 times in 10, any distribution whose
    noncentrality N * sum((p' - p)^2 / p) exceeds `lam90` (printed: 94 here; e.g. 0.024 of the
    mass moved from one cell of p = 0.05 to another). The bug "accept every draft" (emitted =
    the draft model's distribution) is checked to lie far beyond it (lam 27,590). Planted in the
    CPU backend, "the replacement drawn from p instead of max(0, p - q)" fails it (chi-square
    848); "accept with 1.1 p / q" is too small a change for this N (//tests:statistical_test
    catches that one)."""
    vocab, n, k = 16, 4000, 3
    target = tiny_llama(vocab=vocab, hidden=32, layers=2, seed=0, initializer_range=0.3)
    draft = tiny_llama(vocab=vocab, hidden=16, layers=1, seed=1, initializer_range=0.3)
    prompt = [1, 2, 3]
    params = [samplerd.SamplingParams(seed=s) for s in range(n)]  # temperature 1
    generated, accept_rate = speculative_generate(client, target, draft, [prompt] * n, params,
                                                  k=k, max_new_tokens=2, own_drafter=own_drafter)
    counts = np.zeros((vocab, vocab))
    for g in generated:
        counts[g.tokens[0], g.tokens[1]] += 1

    def joint(model):
        first = last_logits(model, [prompt], 1).softmax(-1)[0].double()
        second = last_logits(model, [prompt + [x] for x in range(vocab)], 1).softmax(-1).double()
        return (first[:, None] * second).numpy()

    p, q = joint(target), joint(draft)
    expected = n * p
    big = expected >= 5
    cells_obs = np.append(counts[big], counts[~big].sum())
    cells_exp = np.append(expected[big], expected[~big].sum())
    stat = float(((cells_obs - cells_exp) ** 2 / cells_exp).sum())
    df = len(cells_obs) - 1
    p_value = chi_square_sf(stat, df)
    # The 1e-4 critical value, and the noncentrality with 90% power (normal approximation of
    # the noncentral chi-square: mean df + lam, variance 2 (df + 2 lam)).
    lo, hi = df, 10.0 * df + 100
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if chi_square_sf(mid, df) > 1e-4 else (lo, mid)
    crit, lam90 = hi, 0.0
    while df + lam90 - 1.2816 * math.sqrt(2 * (df + 2 * lam90)) < crit:
        lam90 += 0.5
    q_cells = np.append(q[big], q[~big].sum()) * n
    lam_accept_all = float(((q_cells - cells_exp) ** 2 / cells_exp).sum())
    print(f"\nspeculative ({'own drafter' if own_drafter else 'draft pool'}): N {n}, k {k}, "
          f"accept rate {accept_rate:.3f}; chi-square {stat:.1f} on "
          f"{df} df, p = {p_value:.3g} (critical {crit:.1f}); lam90 {lam90:.0f}; "
          f"'accept every draft' would have lam {lam_accept_all:.0f}")
    assert lam_accept_all > 10 * lam90, "the draft is too close to the target to test anything"
    assert 0.05 < accept_rate < 0.95
    assert p_value > 1e-4, f"emitted tokens are not distributed as the target's (p {p_value:.3g})"


def longest_repeat(tokens):
    """The longest n such that some n-gram occurs twice in `tokens`."""
    best = 0
    for n in range(1, len(tokens)):
        grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
        if len(set(grams)) == len(grams):
            break
        best = n
    return best


def test_dry_breaks_a_greedy_loop(client):
    """A tiny Llama (vocab 64, default init) whose greedy generation falls into a loop; the same
    greedy decoding with DRY (multiplier 0.8, base 1.75, allowed length 2: the values
    text-generation-webui suggests) does not repeat anything longer than a few tokens."""
    model = tiny_llama(vocab=64, hidden=64, layers=2, seed=0)
    prompts = [[1, 17, 22], [3, 4, 5, 6]]
    plain = generate(client, model, prompts, [samplerd.SamplingParams(temperature=0)] * 2, 64)
    dry = samplerd.SamplingParams(temperature=0, dry_multiplier=0.8, dry_base=1.75,
                                  dry_allowed_length=2)
    broken = generate(client, model, prompts, [dry] * 2, 64)
    loops = [longest_repeat(g.tokens) for g in plain]
    after = [longest_repeat(g.tokens) for g in broken]
    print(f"\ndry: longest repeated n-gram in 64 greedy tokens, without DRY {loops}, with {after};"
          f" tail without: {plain[0].tokens[-8:]}, with: {broken[0].tokens[-8:]}")
    assert loops[0] >= 16, "the model no longer loops: the test shows nothing"
    assert max(after) <= 4
