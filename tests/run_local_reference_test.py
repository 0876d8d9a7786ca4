#!/usr/bin/env python3
"""Checks `samplerctl run-local` against an independent NumPy implementation of SPEC.md.

Random PREFILL and DECODE steps (vocabularies of 5 to 3000 tokens, every parameter, grammar
masks, token adjustments (allowed ids, bad words, min_tokens with stop ids, logit bias; a DECODE
row's history includes the earlier rows' drafts), penalties, DRY (over contexts that repeat a
short pattern, with breakers and ranges), force top-N, padding, golden
tokens, prompt logprobs, dense drafts, top-nσ, XTC and RAW logprobs) go to the
real samplerctl binary as protobuf JSON; its JSON answers are compared with this file's own
float64 computation: tokens equal (except where u lies within 1e-6 of an interval edge, or a
top-p cut within 1e-6 of a cumulative sum), logprobs within 1e-5 (values >= -20), top
logprobs, sum_smaller_probs and prompt logprobs likewise. Also checks that bad input exits
non-zero with a message naming the field.
"""
import base64
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np

MASK64 = (1 << 64) - 1
NEG_INF = float("-inf")


def uniform(seed, seq):
    z = (seed + ((seq + 1) * 0x9E3779B97F4A7C15)) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    z = z ^ (z >> 31)
    return (z >> 11) * 2.0 ** -53


def adjust(x, params, history):
    """SPEC 3 step 2a-d on float32 x, from the request's JSON params and the row's history."""
    allowed = params.get("allowedTokenIds")
    if allowed:
        keep = np.zeros(len(x), dtype=bool)
        keep[allowed] = True
        x[~keep] = -np.inf
    for word in params.get("badWords", []):
        ids = word["tokenIds"]
        prefix = ids[:-1]
        if len(history) >= len(prefix) and list(history[len(history) - len(prefix):]) == prefix:
            x[ids[-1]] = -np.inf
    if len(history) < params.get("minTokens", 0):
        for t in params.get("stopTokenIds", []):
            x[t] = -np.inf
    for t, bias in params.get("logitBias", {}).items():
        if x[int(t)] != -np.inf:
            x[int(t)] = x[int(t)] + np.float32(bias)


def dry(x, params, context):
    """SPEC 3 step 3's DRY on float32 x, read literally: the context is the prompt then the
    row's output history, cut to its last dryRange tokens."""
    multiplier = float(np.float32(params.get("dryMultiplier", 0.0)))
    if not multiplier > 0:
        return
    base = float(np.float32(params.get("dryBase", 1.75)))
    allowed = params.get("dryAllowedLength", 2)
    breakers = set(params.get("drySequenceBreakers", []))
    c = list(context)
    if params.get("dryRange", 0) > 0:
        c = c[-params["dryRange"]:]
    n = len(c)
    if n < 2 or c[n - 1] in breakers:
        return
    longest = {}
    for i in range(n - 1):
        if c[i] != c[n - 1] or c[i + 1] in breakers:
            continue
        m = 1
        while m < 50 and i - m >= 0 and c[i - m] == c[n - 1 - m] and c[n - 1 - m] not in breakers:
            m += 1
        longest[c[i + 1]] = max(longest.get(c[i + 1], 0), m)
    for t, m in longest.items():
        if m >= allowed:
            x[t] = x[t] - np.float32(multiplier * base ** (m - allowed))  # -inf stays -inf


def process(raw, vocab, params, force_top_n=0, mask=None, prompt=(), output=(), prompt_mode=False,
            adjustments=None, history=(), xtc_u=1.0):
    """SPEC 3 on one row. Returns (logprobs[V] float64 with -inf, kept order, margin: the
    smallest distance of a top-p cut, a top-nσ bound (relative to max(1, |M|)) or an XTC
    threshold from what it decided); `adjustments` are the request's JSON params, `history`
    the row's output history, `xtc_u` the row's XTC draw."""
    x = np.array(raw[:vocab], dtype=np.float32)
    if not prompt_mode:
        if mask is not None:
            words = np.frombuffer(mask, dtype="<u4")
            bits = np.array([(int(words[t // 32]) >> (t % 32)) & 1 for t in range(vocab)])
            x[bits == 0] = -np.inf
        if adjustments is not None:
            adjust(x, adjustments, list(history))
        r = np.float32(params["repetition_penalty"])
        for t in sorted(set(prompt) | set(output)):
            x[t] = x[t] / r if x[t] > 0 else x[t] * r
        counts = {}
        for t in output:
            counts[t] = counts.get(t, 0) + 1
        for t, c in counts.items():
            x[t] = x[t] - (np.float32(params["presence_penalty"]) +
                           np.float32(params["frequency_penalty"]) * np.float32(c))
        if adjustments is not None:
            dry(x, adjustments, list(prompt) + list(history))
        if 0 < force_top_n < vocab:
            order = sorted(range(vocab), key=lambda t: (-float(x[t]), t))
            for t in order[force_top_n:]:
                x[t] = -np.inf
    sigma_margin = 1.0
    if not prompt_mode and params["top_n_sigma"] > 0:
        finite = x[x != -np.inf].astype(np.float64)
        if len(finite):
            top = finite.max()
            bound = top - params["top_n_sigma"] * math.sqrt(((finite - finite.mean()) ** 2).mean())
            sigma_margin = float(np.abs(finite - bound).min()) / max(1.0, abs(top))
            x[x.astype(np.float64) < bound] = -np.inf
    s = (x / np.float32(params["temperature"])).astype(np.float64)
    if s.max() == NEG_INF:
        return None, [], 1.0  # no token left: an error of the request
    m = s.max()
    e = np.exp(s - m)
    p = e / e.sum()
    order = sorted((t for t in range(vocab) if s[t] != NEG_INF), key=lambda t: (-s[t], t))
    keep = set(order)
    margin = 1.0
    if params["top_p"] < 1.0:
        before = 0.0
        for t in order:
            margin = min(margin, abs(before - params["top_p"]))
            if before > params["top_p"]:
                keep.discard(t)
            before += p[t]
    if params["top_k"] > 0:
        kept = [t for t in order if t in keep]
        for t in kept[params["top_k"]:]:
            keep.discard(t)
    if not prompt_mode and params["min_p"] > 0:
        pmax = max(p[t] for t in keep)
        for t in list(keep):
            if p[t] < params["min_p"] * pmax:
                keep.discard(t)
    kept_sum = sum(e[t] for t in keep)
    if not prompt_mode and xtc_u < params["xtc_probability"]:
        # XTC: the kept tokens of p >= threshold in the draw's order; all but the last go.
        above = []
        for t in order:
            if t in keep:
                margin = min(margin, abs(e[t] / kept_sum - params["xtc_threshold"]))
                if e[t] / kept_sum >= params["xtc_threshold"]:
                    above.append(t)
        if len(above) >= 2:
            for t in above[:-1]:
                keep.discard(t)
            kept_sum = sum(e[t] for t in keep)
    lp = np.full(vocab, NEG_INF)
    for t in keep:
        lp[t] = (s[t] - m) - math.log(kept_sum)
    return lp, [t for t in order if t in keep], min(margin, sigma_margin)


def raw_logprobs(raw, vocab):
    """SPEC 7's RAW mode: log_softmax of the row as sent (columns < V), and its order (largest
    first, ties by lower id, -inf never listed)."""
    x = np.array(raw[:vocab], dtype=np.float32).astype(np.float64)
    m = x.max()
    lp = x - m - math.log(np.exp(x - m).sum())
    order = sorted((t for t in range(vocab) if lp[t] != NEG_INF), key=lambda t: (-lp[t], t))
    return lp, order


def xtc_uniform(seed, position):
    """SPEC 3 step 8's draw: U(seed + 3000000019, pos)."""
    return uniform((seed + 3000000019) & MASK64, position)


def draw(lp, order, u):
    probs = [math.exp(lp[t]) for t in order]
    total = sum(probs)
    target = u * total
    cum, edge, chosen = 0.0, 1.0, None
    for t, q in zip(order, probs):
        edge = min(edge, abs(cum - target) / total)
        cum += q
        if chosen is None and cum > target:
            chosen = t
    edge = min(edge, abs(cum - target) / total)
    return (chosen if chosen is not None else order[-1]), edge


def draw_weights(weights, u):
    order = sorted((t for t, w in enumerate(weights) if w > 0), key=lambda t: (-weights[t], t))
    total = sum(weights[t] for t in order)
    target, cum, edge = u * total, 0.0, 1.0
    chosen = None
    for t in order:
        edge = min(edge, abs(cum - target) / total)
        cum += weights[t]
        if chosen is None and cum > target:
            chosen = t
    return (chosen if chosen is not None else order[-1]), edge


def sum_smaller(lp, token):
    if lp[token] == NEG_INF:
        return 0.0
    return sum(math.exp(lp[x]) for x in range(len(lp))
               if lp[x] != NEG_INF and (lp[x] < lp[token] or (lp[x] == lp[token] and x <= token)))


def normalised(params):
    p = {"temperature": params.get("temperature", 1.0), "top_p": params.get("topP", 1.0),
         "top_k": params.get("topK", -1), "min_p": params.get("minP", 0.0),
         "repetition_penalty": params.get("repetitionPenalty", 1.0),
         "presence_penalty": params.get("presencePenalty", 0.0),
         "frequency_penalty": params.get("frequencyPenalty", 0.0),
         "top_n_sigma": params.get("topNSigma", 0.0),
         "xtc_probability": params.get("xtcProbability", 0.0),
         "xtc_threshold": params.get("xtcThreshold", 0.1),
         "raw": params.get("logprobsMode") == "LOGPROBS_MODE_RAW"}
    if p["temperature"] < 1e-5:
        p.update(temperature=1e-5, top_p=1.0, top_k=-1, min_p=0.0, top_n_sigma=0.0,
                 xtc_probability=0.0)
    for k in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty",
              "frequency_penalty", "top_n_sigma", "xtc_probability", "xtc_threshold"):
        p[k] = float(np.float32(p[k]))
    return p


def run_samplerctl(binary, step):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(step, f)
        path = f.name
    try:
        proc = subprocess.run([binary, "run-local", path, "--threads=2"], capture_output=True,
                              text=True)
    finally:
        os.unlink(path)
    return proc


class Checker:
    def __init__(self):
        self.compared = 0
        self.skipped = 0
        self.no_token = 0  # requests whose adjustments left no token (their error checked)
        self.dry = 0  # requests with DRY on, over a repeating context
        self.filters = 0  # requests with top-nσ, XTC or RAW logprobs (issue 50)

    def close(self, got, want, what):
        if want == NEG_INF:
            assert got == NEG_INF or got == "-Infinity", f"{what}: got {got}, want -inf"
        elif want >= -20:
            assert abs(float(got) - want) <= 1e-5, f"{what}: got {got}, want {want}"

    def outputs(self, res, k, row_lp, row_order, token, top_n, want_ssp, what, raw=None):
        """`raw`: RAW mode's (logprobs, order) of the row, which the reported logprobs are;
        sum_smaller_probs stays processed."""
        shown_lp, shown_order = raw if raw is not None else (row_lp, row_order)
        self.close(res["logprobs"][k], shown_lp[token], f"{what} logprob")
        if top_n:
            tops = res["topLogprobs"][k]
            for i in range(top_n):
                want_id = shown_order[i] if i < len(shown_order) else -1
                assert tops["tokenIds"][i] == want_id, f"{what} top[{i}] id"
                if want_id >= 0:
                    self.close(tops["logprobs"][i], shown_lp[want_id], f"{what} top[{i}]")
        if want_ssp:
            assert abs(res["sumSmallerProbs"][k] - sum_smaller(row_lp, token)) <= 1e-5, what


def random_params(rng, vocab):
    params = {"seqSeed": str(int(rng.integers(0, 2**63)))}
    if rng.random() < 0.8:
        params["temperature"] = float(rng.choice([0.0, 0.3, 0.7, 1.0, 1.6]))
    if rng.random() < 0.5:
        params["topP"] = float(rng.choice([0.5, 0.8, 0.95]))
    if rng.random() < 0.5:
        params["topK"] = int(rng.integers(1, vocab + 2))
    if rng.random() < 0.3:
        params["minP"] = float(rng.choice([0.01, 0.1, 0.5]))
    if rng.random() < 0.3:
        params["repetitionPenalty"] = float(rng.choice([0.8, 1.2, 2.0]))
        params["presencePenalty"] = float(rng.choice([-0.5, 0.0, 1.0]))
        params["frequencyPenalty"] = float(rng.choice([-0.2, 0.3]))
    params["topLogprobs"] = int(rng.integers(0, 6))
    # Issue 50: top-nσ, XTC and RAW logprobs, drawn last (the draws above keep their stream).
    if rng.random() < 0.3:
        params["topNSigma"] = float(rng.choice([0.5, 1.0, 2.0]))
    if rng.random() < 0.3:
        params["xtcProbability"] = float(rng.choice([0.5, 1.0]))
        params["xtcThreshold"] = float(rng.choice([0.05, 0.1, 0.3]))
    if rng.random() < 0.3:
        params["logprobsMode"] = "LOGPROBS_MODE_RAW"
    return params


def random_adjustments(rng, vocab, params, history):
    """Adds random token adjustments to `params` (JSON); some bad words end the history."""
    if rng.random() < 0.2:
        n = int(rng.integers(1, vocab // 2 + 2))
        params["allowedTokenIds"] = [int(t) for t in rng.integers(0, vocab, size=n)]
    if rng.random() < 0.4:
        words = []
        for _ in range(int(rng.integers(1, 4))):
            length = int(rng.integers(1, 4))
            if history and rng.random() < 0.5:  # a word the history completes
                tail = list(history[-(length - 1):]) if length > 1 else []
                words.append(tail + [int(rng.integers(0, vocab))])
            else:
                words.append([int(t) for t in rng.integers(0, vocab, size=length)])
        params["badWords"] = [{"tokenIds": w} for w in words]
    if rng.random() < 0.3:
        params["minTokens"] = int(rng.integers(0, 8))
        params["stopTokenIds"] = [int(t) for t in rng.integers(0, vocab, size=int(rng.integers(1, 4)))]
    if rng.random() < 0.5:
        n = int(rng.integers(1, 9))
        params["logitBias"] = {str(int(t)): float(np.float32(rng.choice([-100.0, -3.5, -0.25, 0.5, 2.0, 7.0, 100.0])))
                               for t in rng.integers(0, vocab, size=n)}


def random_dry(rng, vocab, params):
    """With probability 0.4, DRY settings in `params` and a (prompt, output) whose context
    repeats a short pattern and ends inside it, so that matches are many and some long; else
    None."""
    if rng.random() >= 0.4:
        return None
    pattern = [int(t) for t in rng.integers(0, vocab, size=int(rng.integers(2, 6)))]
    # Up to 70 repeated tokens before the output continues them: matches past SPEC's 50 cap.
    prompt = [int(t) for t in rng.integers(0, vocab, size=2)] + pattern * int(rng.integers(2, 15))
    output = pattern * int(rng.integers(0, 3)) + pattern[:int(rng.integers(1, len(pattern) + 1))]
    params["dryMultiplier"] = float(np.float32(rng.choice([0.5, 0.8, 3.0])))
    if rng.random() < 0.5:
        params["dryBase"] = float(np.float32(rng.choice([1.0, 1.02, 1.75, 2.5])))
    if rng.random() < 0.5:
        params["dryAllowedLength"] = int(rng.integers(1, 4))
    if rng.random() < 0.4:
        params["drySequenceBreakers"] = sorted({int(rng.choice(pattern)), int(rng.integers(0, vocab))})
    if rng.random() < 0.4:
        params["dryRange"] = int(rng.integers(1, 40))
    return prompt, output


def check_prefill(binary, rng, checker):
    vocab = int(rng.choice([5, 37, 300, 3000]))
    cols = vocab + int(rng.integers(0, 3))
    n_req = int(rng.integers(1, 5))
    prompt_len = int(rng.integers(0, 4))
    rows = n_req * (prompt_len + 1)
    scale = float(rng.choice([0.5, 2.0, 5.0]))
    logits = (rng.normal(0, scale, size=(rows, cols))).astype(np.float32)
    if rng.random() < 0.3:
        logits = np.round(logits * 2) / 2  # exact ties
    logits[:, vocab:] = np.nan  # padding: never read
    force_top_n = int(rng.choice([0, 0, max(1, vocab // 3)]))
    requests, expect = [], []
    for i in range(n_req):
        base = i * (prompt_len + 1)
        req = {"requestId": f"r{i}", "row": base + prompt_len,
               "samplePosition": str(int(rng.integers(1, 1000))),
               "params": random_params(rng, vocab)}
        prompt = [int(t) for t in rng.integers(0, vocab, size=3)]
        output = [int(t) for t in rng.integers(0, vocab, size=int(rng.integers(0, 6)))]
        repeats = random_dry(rng, vocab, req["params"])
        if repeats is not None:
            prompt, output = repeats
            checker.dry += 1
        req["promptTokenIds"], req["outputTokenIds"] = prompt, output
        random_adjustments(rng, vocab, req["params"], output)
        mask = None
        if rng.random() < 0.4:
            allowed = rng.random(vocab) < 0.5
            allowed[int(rng.integers(0, vocab))] = True
            words = np.zeros((vocab + 31) // 32, dtype="<u4")
            for t in np.nonzero(allowed)[0]:
                words[t // 32] |= np.uint32(1 << (int(t) % 32))
            mask = words.tobytes()
            req["allowedTokenMasks"] = [base64.b64encode(mask).decode()]
        if rng.random() < 0.2:
            req["goldenTokenIds"] = [int(rng.integers(0, vocab))]
        if prompt_len:
            req["promptFirstRow"] = base
            req["promptTargets"] = [int(t) for t in rng.integers(0, vocab, size=prompt_len)]
        requests.append(req)
        expect.append((req, mask, prompt, output))
    step = {"stepId": "3", "logits": {"dtype": "FLOAT32", "rows": rows, "cols": cols,
                                      "data": base64.b64encode(logits.tobytes()).decode()},
            "inputs": {"kind": "PREFILL", "vocabSize": vocab, "forceTopN": force_top_n,
                       "computeSumSmallerProbs": True, "requests": requests}}
    proc = run_samplerctl(binary, step)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    for res, (req, mask, prompt, output) in zip(out["results"], expect):
        what = f"prefill V={vocab} {req['requestId']} {req['params']}"
        params = normalised(req["params"])
        seed = int(req["params"]["seqSeed"])
        lp, order, margin = process(logits[req["row"]], vocab, params, force_top_n, mask, prompt,
                                    output, adjustments=req["params"], history=output,
                                    xtc_u=xtc_uniform(seed, int(req["samplePosition"])))
        raw = raw_logprobs(logits[req["row"]], vocab) if params["raw"] else None
        if not order:
            assert res["status"]["code"] == 3 and "no token left" in res["status"]["message"], \
                f"{what}: {res}"
            checker.no_token += 1
            continue
        assert "status" not in res, f"{what}: {res.get('status')}"
        assert res["seqSeed"] == req["params"]["seqSeed"]
        if margin < 1e-6:
            checker.skipped += 1
            continue
        golden = req.get("goldenTokenIds", [-1])[0]
        want, edge = draw(lp, order, uniform(seed, 3 * int(req["samplePosition"])))
        token = res["tokenIds"][0]
        if golden >= 0:
            assert token == golden, what
        elif edge >= 1e-6:
            assert token == want, f"{what}: token {token}, want {want}"
        checker.outputs(res, 0, lp, order, token, req["params"]["topLogprobs"], True, what, raw)
        for k, target in enumerate(req.get("promptTargets", [])):
            plp, _, pmargin = process(logits[req["promptFirstRow"] + k], vocab, params,
                                      prompt_mode=True)
            if params["raw"]:
                plp, pmargin = raw_logprobs(logits[req["promptFirstRow"] + k], vocab)[0], 1.0
            if pmargin >= 1e-6:
                checker.close(res["promptLogprobs"][k], plp[target], f"{what} prompt[{k}]")
        checker.compared += 1
        checker.filters += any(k in req["params"] for k in ("topNSigma", "xtcProbability",
                                                              "logprobsMode"))


def check_decode(binary, rng, checker):
    vocab = int(rng.choice([5, 37, 300]))
    n_req = int(rng.integers(1, 4))
    qs = [int(rng.integers(1, 5)) for _ in range(n_req)]
    rows = sum(qs)
    logits = rng.normal(0, 1.5, size=(rows, vocab)).astype(np.float32)
    requests, first = [], 0
    for i, q in enumerate(qs):
        params = random_params(rng, vocab)
        params.pop("repetitionPenalty", None)
        params.pop("presencePenalty", None)
        params.pop("frequencyPenalty", None)
        drafts = rng.normal(0, 1.5, size=(max(q - 1, 1), vocab))
        drafts = drafts - np.log(np.exp(drafts).sum(axis=1, keepdims=True))
        draft_ids = [int(rng.choice(vocab, p=np.exp(drafts[j]))) for j in range(q - 1)]
        output = [int(t) for t in rng.integers(0, vocab, size=int(rng.integers(0, 5)))]
        prompt = []
        repeats = random_dry(rng, vocab, params)
        if repeats is not None:
            prompt, output = repeats
            checker.dry += 1
        random_adjustments(rng, vocab, params, output + draft_ids)
        req = {"requestId": f"d{i}", "firstRow": first, "numRows": q,
               "samplePosition": str(int(rng.integers(1, 10**6))), "params": params,
               "draftTokenIds": draft_ids, "outputTokenIds": output, "promptTokenIds": prompt}
        if q > 1:
            req["draftLogprobs"] = {"rows": q - 1, "cols": vocab,
                                    "values": {"values": drafts[:q - 1].astype(np.float32).ravel().tolist()}}
        requests.append((req, drafts.astype(np.float32)))
        first += q
    step = {"stepId": "4", "logits": {"rows": rows, "cols": vocab,
                                      "values": {"values": logits.ravel().tolist()}},
            "inputs": {"kind": "DECODE", "vocabSize": vocab,
                       "requests": [r for r, _ in requests]}}
    proc = run_samplerctl(binary, step)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    for res, (req, drafts) in zip(out["results"], requests):
        what = f"decode V={vocab} {req['requestId']} {req['params']}"
        params = normalised(req["params"])
        seed = int(req["params"]["seqSeed"])
        q = req["numRows"]
        # Row j's history: the output, then the drafts of rows 0..j-1.
        # (No repetition penalty here: the prompt counts for DRY only.)
        rows = [process(logits[req["firstRow"] + j], vocab, params, prompt=req["promptTokenIds"],
                        adjustments=req["params"],
                        history=req["outputTokenIds"] + [d for d in req["draftTokenIds"][:j] if d >= 0],
                        xtc_u=xtc_uniform(seed, int(req["samplePosition"]) + j * 10000019))
                for j in range(q)]
        if any(not order for _, order, _ in rows):  # any row the request reads: its error
            assert res["status"]["code"] == 3 and "no token left" in res["status"]["message"], \
                f"{what}: {res}"
            checker.no_token += 1
            continue
        assert "status" not in res, f"{what}: {res.get('status')}"
        want_tokens, accepted, exact = [], 0, True
        for j in range(q):
            lp, order, margin = rows[j]
            exact &= margin >= 1e-6
            pos = int(req["samplePosition"]) + j * 10000019
            if j == q - 1:
                tok, edge = draw(lp, order, uniform(seed, 3 * pos))
                exact &= edge >= 1e-6
                want_tokens.append(tok)
                break
            d = req["draftTokenIds"][j]
            pd = math.exp(lp[d]) if lp[d] != NEG_INF else 0.0
            qd = math.exp(float(drafts[j][d]))
            ratio_u = uniform(seed, 3 * pos + 2)
            exact &= abs(ratio_u - pd / qd) > 1e-6
            if qd > 0 and ratio_u < pd / qd:
                want_tokens.append(d)
                accepted += 1
                continue
            resid = [max(0.0, (math.exp(lp[t]) if lp[t] != NEG_INF else 0.0) -
                         math.exp(float(drafts[j][t]))) for t in range(vocab)]
            u = uniform(seed, 3 * pos + 1)
            if sum(resid) > 0:
                tok, edge = draw_weights(resid, u)
            else:
                tok, edge = draw(lp, order, u)
            exact &= edge >= 1e-6
            want_tokens.append(tok)
            break
        if not exact:
            checker.skipped += 1
            continue
        assert res["tokenIds"] == want_tokens, f"{what}: {res['tokenIds']} vs {want_tokens}"
        assert res.get("numAccepted", 0) == accepted, what
        for k, tok in enumerate(want_tokens):
            lp, order, _ = rows[k]
            raw = raw_logprobs(logits[req["firstRow"] + k], vocab) if params["raw"] else None
            checker.outputs(res, k, lp, order, tok, req["params"]["topLogprobs"], False, what, raw)
        checker.compared += 1
        checker.filters += any(k in req["params"] for k in ("topNSigma", "xtcProbability",
                                                              "logprobsMode"))


def check_errors(binary):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        f.write("{ not json")
    proc = subprocess.run([binary, "run-local", f.name], capture_output=True, text=True)
    os.unlink(f.name)
    assert proc.returncode == 1 and "not a SampleRequest" in proc.stderr, proc.stderr
    bad_step = {"logits": {"rows": 1, "cols": 4, "values": {"values": [0, 1, 2, 3]}},
                "inputs": {"kind": "PREFILL", "vocabSize": 9, "requests": [{"row": 0}]}}
    proc = run_samplerctl(binary, bad_step)
    assert proc.returncode == 1 and "inputs.vocab_size" in proc.stderr, proc.stderr
    short = {"logits": {"rows": 2, "cols": 4, "values": {"values": [0, 1, 2, 3]}},
             "inputs": {"kind": "PREFILL", "vocabSize": 4, "requests": [{"row": 0}]}}
    proc = run_samplerctl(binary, short)
    assert proc.returncode == 1 and "logits.values" in proc.stderr, proc.stderr
    bad_request = {"logits": {"rows": 2, "cols": 4, "values": {"values": [0] * 8}},
                   "inputs": {"kind": "PREFILL", "vocabSize": 4, "requests": [
                       {"requestId": "bad", "row": 0, "params": {"topP": 0}},
                       {"requestId": "good", "row": 1, "params": {"seqSeed": "3"}}]}}
    proc = run_samplerctl(binary, bad_request)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["results"][0]["status"]["code"] == 3, out
    assert "params.top_p" in out["results"][0]["status"]["message"], out
    assert "status" not in out["results"][1] and len(out["results"][1]["tokenIds"]) == 1, out


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else "bazel-bin/client/samplerctl"
    rng = np.random.default_rng(20261201)
    checker = Checker()
    for _ in range(60):
        check_prefill(binary, rng, checker)
    for _ in range(60):
        check_decode(binary, rng, checker)
    check_errors(binary)
    print(f"compared {checker.compared} requests against the NumPy reference, "
          f"skipped {checker.skipped} within 1e-6 of an edge, {checker.no_token} with no token "
          f"left (their error checked); {checker.dry} of them with DRY, {checker.filters} "
          "compared with top-nσ, XTC or RAW logprobs")
    assert checker.compared >= 0.8 * (checker.compared + checker.skipped)
    assert checker.dry >= 20, "too few DRY requests to tell"
    assert checker.filters >= 40, "too few top-nσ / XTC / RAW requests to tell"


if __name__ == "__main__":
    main()
