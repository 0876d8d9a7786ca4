#!/usr/bin/env python3
"""Mutation testing (issue 27): plants one deliberate bug at a time, runs the tests, and prints
which bugs no test caught. Run by hand (each mutant rebuilds; not part of CI):

    python3 scripts/mutate.py                 # every CPU mutant
    python3 scripts/mutate.py residual-from-p half-exponent-bias   # some, by id
    python3 scripts/mutate.py --list
    python3 scripts/mutate.py --check         # every mutant's text is still there (CI runs it)

A mutant is a literal edit of one file (`old` must occur; `nth` picks among several
occurrences) and the Bazel tests that should catch it (a test target list keeps each run
short; `bazel test //... --test_tag_filters=-gpu` is the last word). The file is restored after
each mutant, whatever happens. Exit status: the number of survivors (0: every bug caught).
GPU mutants (the kernels) are built here and run on the GPU machine:

    python3 scripts/mutate.py --gpu-pack        # then, on the GPU machine (carry .device-pack):
    bash scripts/mutate_gpu.sh

--gpu-pack also writes .device-pack/mutants.tar.xz: the test binaries alone (near-identical,
so xz keeps five in ~3 MB where the packs take ~9 MB each), to carry beside
.device-pack-mps (`bash scripts/gpu_mps.sh`), whose libraries they use:

    MUTANT_TARBALL=.device-pack/mutants.tar.xz bash scripts/mutate_gpu.sh
"""
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
SAMPLER = ["//sampler:all"]
STATS = ["//tests:statistical_test"]
PIPELINE = ["//pipeline:all", "//server:all", "//tests:server_e2e_test", "//tests:run_local_reference_test"]

# id, file, old, new, tests, nth (0: the first occurrence)
MUTANTS = [
    # The review's table (issue 27).
    ("skip-min-p", "sampler/row_processor.cc",
     "if (!options.prompt_mode && params.min_p > 0.0f) ApplyMinP(params.min_p);",
     "if (false) ApplyMinP(params.min_p);", SAMPLER, 0),
    ("top-p-gt-to-ge", "sampler/spec_rules.h",
     "return before / total > static_cast<double>(top_p);",
     "return before / total >= static_cast<double>(top_p);", SAMPLER, 0),
    ("ties-by-higher-id", "sampler/row_kernels.h",
     "(scores[a] == scores[b] && a < b)", "(scores[a] == scores[b] && a > b)", SAMPLER, 0),
    # The per-token seam (issue 28): the merge's composition, and a bias that leaves float32.
    ("merge-bias-last-wins", "sampler/token_updates.cc",
     "into.bias = (into.flags & kUpdateBias) ? into.bias + u.bias : u.bias;",
     "into.bias = u.bias;", SAMPLER, 0),
    ("merge-drops-ban", "sampler/token_updates.cc",
     "into.flags |= u.flags;", "into.flags |= (u.flags & ~kUpdateBan);", SAMPLER, 0),
    # Issue 45: a request's history merged once, each row's own entries merged into it.
    ("history-merge-drops-row-entry", "sampler/token_updates.cc",
     "      Merge(out.back(), b[j++]);", "      ++j;", SAMPLER, 0),
    ("row-drafts-not-counted", "sampler/token_updates.cc",
     "for (int32_t t : drafts_before) {", "for (int32_t t : absl::Span<const int32_t>()) {",
     SAMPLER, 0),
    ("bias-overflow-unflagged", "sampler/spec_rules.h",
     "  const float y = x + add;\n  *left_range = *left_range || LeftFloatRange(x, y);",
     "  const float y = x + add;", SAMPLER, 0),
    ("drop-presence-penalty", "sampler/spec_rules.h",
     "x = x - (presence + frequency * static_cast<float>(count));",
     "x = x - (frequency * static_cast<float>(count));", SAMPLER, 0),
    ("accept-1.1-p-over-q", "sampler/spec_rules.h",
     "return draft >= 0 && q > 0.0 && u < p / q;",
     "return draft >= 0 && q > 0.0 && u < 1.1 * p / q;", SAMPLER + STATS, 0),
    ("residual-from-p", "sampler/row_processor.cc",
     "for (const auto& [w, t] : entries_) dense_[t] = w;",
     "for (const auto& [w, t] : entries_) dense_[t] = Probability(t);", SAMPLER, 0),
    ("half-exponent-bias", "sampler/dtype.h",
     "word = sign | ((exponent + 112) << 23) | (mantissa << 13);",
     "word = sign | ((exponent + 111) << 23) | (mantissa << 13);", SAMPLER, 0),
    # Reported apart, as equivalent within SPEC's precision: the fallback runs only when the
    # histogram's float64 sums (grouped by bucket) put the nucleus' end one bucket earlier than
    # the sequential float64 sum does, i.e. when top_p * total lies between two sums of the same
    # weights that differ by rounding (~1e-16 relative); it then keeps the next token. Reaching
    # it needs weights spanning > 2^29 and a top_p tuned to that window; whether that token is
    # kept is then a 1-ulp question on which two float64 implementations of SPEC 3.6 (the
    # reference's included) may differ, so no test of the contract can tell the two apart.
    ("no-histogram-fallback", "sampler/row_processor.cc",
     "if (keep == candidates.size() && !by_rank && !TopPRemoves(before, total_sum_, top_p)) {",
     "if (false) {", SAMPLER, 0),
    ("min-p-lt-to-le", "sampler/row_processor.cc",
     "MinPRemoves(weights_[kept_.back()], min_p)) kept_.pop_back();",
     "weights_[kept_.back()] <= min_p) kept_.pop_back();", SAMPLER, 0),
    # Our own: validation, conversion, the rules, the row pipeline.
    ("top-p-accepts-zero", "sampler/validate.cc",
     "if (!(p > 0.0f && p <= 1.0f))", "if (!(p >= 0.0f && p <= 1.0f))", SAMPLER, 0),
    ("slice-check-off-by-one", "sampler/extent.cc",
     "extent > size - offset)", "extent > size - offset + 1)", ["//sampler:all", "//server:all"], 0),
    ("repetition-penalty-swapped", "sampler/spec_rules.h",
     "x = x > 0.0f ? x / repetition : x * repetition;",
     "x = x > 0.0f ? x * repetition : x / repetition;", SAMPLER, 0),
    ("decode-position-stride", "sampler/spec_rules.h",
     "kDecodeRowPositionStride = 10000019ULL;", "kDecodeRowPositionStride = 10000018ULL;",
     SAMPLER, 0),
    # DRY (issue 33).
    ("dry-no-match-cap", "sampler/token_updates.cc",
     "int32_t cap = std::min<int32_t>(kDryMaxMatch, static_cast<int32_t>(tail_size));",
     "int32_t cap = static_cast<int32_t>(tail_size);", SAMPLER, 0),
    ("dry-breakers-inside-matches", "sampler/token_updates.cc",
     "    if (breaker(tail(m))) cap = m;", "", SAMPLER, 0),
    ("dry-shortest-match", "sampler/token_updates.cc",
     "(a.first == b.first && a.second > b.second)", "(a.first == b.first && a.second < b.second)",
     SAMPLER, 0),
    ("dry-range-ignored", "sampler/token_updates.cc",
     "const size_t n = dry.range > 0 ?", "const size_t n = false ?", SAMPLER, 0),
    ("dry-no-match-across-pieces", "sampler/token_updates.cc",
     "static_cast<size_t>(run) < k || p == 0) break;",
     "static_cast<size_t>(run) < k || p <= 1) break;", SAMPLER, 0),
    ("dry-last-in-piece-no-successor", "sampler/token_updates.cc",
     "} else if (p + 1 < num_pieces) {", "} else if (false) {", SAMPLER, 0),
    ("token-scan-mask-shift", "sampler/token_scan.cc",
     "_mm256_castsi256_ps(e2))) << 16", "_mm256_castsi256_ps(e2))) << 15", SAMPLER, 0),
    # SPEC 5's order for the full-vocabulary draw (issue 34): equal float weights of different
    # scores go by score, not by id.
    ("draw-equal-weights-by-id", "sampler/row_processor.cc",
     "ScoreOrder{scores_.data()});",
     "[this](int32_t a, int32_t b) {\n        return weights_[a] > weights_[b] || "
     "(weights_[a] == weights_[b] && a < b);\n      });", SAMPLER, 0),
    ("accept-zero-q", "sampler/spec_rules.h",
     "return draft >= 0 && q > 0.0 && u < p / q;", "return draft >= 0 && u < p / q;", SAMPLER, 0),
    ("sum-smaller-excludes-self", "sampler/row_processor.cc",
     "(s == pivot && x <= token)", "(s == pivot && x < token)", SAMPLER, 0),
    ("top-logprobs-past-kept", "sampler/row_processor.cc",
     "if (!Kept(t)) break;  // the kept set is a prefix of this order",
     "// mutant: no break", SAMPLER, 0),
    ("bf16-shift", "sampler/dtype.h",
     "uint32_t word = static_cast<uint32_t>(bits) << 16;",
     "uint32_t word = static_cast<uint32_t>(bits) << 15;", SAMPLER, 0),
    # The pipeline (conversion to and from the wire).
    ("row-stride-default-ignored", "pipeline/proto_convert.cc",
     "layout.row_stride = tensor.row_stride() == 0 ? tensor.cols() : tensor.row_stride();",
     "layout.row_stride = tensor.cols();", PIPELINE, 0),
    ("sum-smaller-not-sent", "pipeline/proto_convert.cc",
     "out->mutable_sum_smaller_probs()->Add(r.sum_smaller_probs.begin(), r.sum_smaller_probs.end());",
     "// mutant: sum_smaller_probs dropped", PIPELINE, 0),
    # Issue 50: top-nσ, XTC and raw logprobs.
    ("top-n-sigma-sample-variance", "sampler/row_processor.cc",
     "std::sqrt(squares / static_cast<double>(count))",
     "std::sqrt(squares / static_cast<double>(count - 1))", SAMPLER, 0),
    ("xtc-keeps-the-first", "sampler/row_processor.cc",
     "  head_score_ = scores_[top[removed - 1]];\n  head_token_ = top[removed - 1];",
     "  head_score_ = scores_[top[removed]];\n  head_token_ = top[removed];", SAMPLER, 0),
    ("xtc-no-rebase", "sampler/row_processor.cc",
     "    if (ApplyXtc(params.xtc_threshold)) RebaseKept();",
     "    if (ApplyXtc(params.xtc_threshold)) SumKept();", SAMPLER, 0),
    ("xtc-draft-seed-domain", "sampler/spec_rules.h",
     "return UniformDouble(seed + kXtcSeedOffset, position);",
     "return UniformDouble(seed + kDraftSeedOffset, position);", SAMPLER, 0),
    ("raw-top-is-processed", "sampler/cpu_backend.cc",
     "        proc.RawTop(request.params.top_logprobs, &out.top);",
     "        proc.Top(request.params.top_logprobs, &out.top);", SAMPLER, 0),
    ("min-p-cut-ge-to-gt", "sampler/spec_rules.h",
     "SAMPLERD_SPEC_FN bool MinPRemoves(float weight, float min_p) { return weight < min_p; }",
     "SAMPLERD_SPEC_FN bool MinPRemoves(float weight, float min_p) { return weight <= min_p; }",
     SAMPLER, 0),
]


# GPU mutants (the kernels): `--gpu-pack` builds each into .device-pack/mutants/ID/ (the
# cuda_backend_test binary, -c opt, with its libraries); `bash scripts/mutate_gpu.sh` runs them
# on the GPU machine and prints which survived. id, file, old, new, nth.
GPU_MUTANTS = [
    ("gpu-replacement-seed-domain", "cuda/kernels/finish.cuh",
     "return replace(UniformDouble(job.seed, SequenceNumber(job.position, DrawCase::kReplacement)));",
     "return replace(UniformDouble(job.seed, SequenceNumber(job.position, DrawCase::kFresh)));", 0),
    ("gpu-residual-is-p", "cuda/kernels/general.cuh",
     "r = static_cast<double>(expf(s - M)) / Zk - exp(static_cast<double>(DraftLogprob(job, c)));",
     "r = static_cast<double>(expf(s - M)) / Zk;", 0),
    ("gpu-fused-temperature", "cuda/fused_path.cu",
     "sh.cand_s[slot] = v / T;  // the exact score",
     "sh.cand_s[slot] = v / (T * 1.001f);", 0),
    # Issue 47: a worker's draft rows in device memory.
    ("gpu-draft-check-skips-inf", "cuda/general_path.cu",
     "if (isnan(v) || v == INFINITY) {", "if (isnan(v)) {", 0),
    ("gpu-draft-dtype-ignored", "cuda/sampling_kernels.cuh",
     "if (job.q_n == 0) return LoadLogit(job.q_values, job.q_dtype, c);",
     "if (job.q_n == 0) return LoadLogit(job.q_values, DType::kFloat32, c);", 0),
    ("gpu-accept-seed-domain", "cuda/kernels/finish.cuh",
     "const double u = UniformDouble(job.seed, SequenceNumber(job.position, DrawCase::kAcceptReject));",
     "const double u = UniformDouble(job.seed, SequenceNumber(job.position, DrawCase::kFresh));", 0),
    # Issue 50 in the general algorithm.
    ("gpu-sigma-sample-variance", "cuda/kernels/general.cuh",
     "sqrt(squares / static_cast<double>(n))", "sqrt(squares / static_cast<double>(n - 1))", 0),
    ("gpu-xtc-removes-the-last-too", "cuda/kernels/general.cuh",
     "                    above - 2);", "                    above - 1);", 0),
    ("gpu-raw-top-processed", "cuda/kernels/general.cuh",
     "out.top_logprobs[i] = sh.sel_id < 0 ? kNegInf : raw ? raw_lp(sh.sel_id) : lp_of(sh.sel_id);",
     "out.top_logprobs[i] = sh.sel_id < 0 ? kNegInf : lp_of(sh.sel_id);", 0),
    # Issue 50 on the fused and split paths: top-nσ's cut on the resident row, XTC in the
    # candidates' finish.
    ("gpu-fused-sigma-sample-variance", "cuda/fused_path.cu",
     "static_cast<double>(job.top_n_sigma) * sqrt(deviation[0] / finite);",
     "static_cast<double>(job.top_n_sigma) * sqrt(deviation[0] / (finite - 1.0));", 0),
    ("gpu-fused-sigma-fallback-keeps-the-cut", "cuda/fused_path.cu",
     "    fallback(sigma);  // a top-nσ row's xs holds the cut", "    fallback(false);  // a top-nσ row's xs holds the cut", 0),
    ("gpu-finish-xtc-removes-the-last-too", "cuda/kernels/finish.cuh",
     "return !(weight(i) / Zk >= limit); }) - 1;", "return !(weight(i) / Zk >= limit); });", 0),
    ("gpu-finish-xtc-no-rebase", "cuda/kernels/finish.cuh",
     "      M = sh.cand_s[0];\n", "", 0),
    # Issue 50's RAW logprobs on the fast paths (RawLogprobsKernel).
    ("gpu-raw-kernel-applies-updates", "cuda/raw_logprobs.cu",
     "  as_sent.update_end = as_sent.update_begin;\n", "", 0),
    ("gpu-raw-kernel-ties-by-higher-id", "cuda/raw_logprobs.cu",
     "(other == key && sh.cand_id[k] < id);", "(other == key && sh.cand_id[k] > id);", 0),
    ("gpu-raw-kernel-radix-drops-a-tie", "cuda/raw_logprobs.cu",
     "if (tie && before <= rest) append(i, prefix);", "if (tie && before < rest) append(i, prefix);", 0),
    # Issue 49's streaming split kernel (a block a row, the next chunk staged by cp.async).
    ("gpu-stream-stages-the-chunk-after-next", "cuda/split_path.cu",
     "StageChunk<G>(p, split_index, c + 1, layout.chunks, staging)",
     "StageChunk<G>(p, split_index, c + 2, layout.chunks, staging)", 0),
    ("gpu-stream-skips-the-wait", "cuda/split_path.cu",
     'if (staged) asm volatile("cp.async.wait_group 0;\\n" ::: "memory");', "", 0),
    # A bf16 / fp16 row with updates: the next chunk's copy started while other threads still
    # read their floats back from staging.
    ("gpu-stream-update-copy-overlaps-readback", "cuda/split_path.cu",
     "    if (kForeign) __syncthreads();  // every thread has read its values back\n", "", 0),
    # Issue 49, fourth session: flat rows finished from their top K.
    ("gpu-flat-finish-drops-the-kth", "cuda/kernels/split_finish.cuh",
     "if (!cut || AtOrBefore(OrderKey(s), c, cut_key, cut_id)) {",
     "if (!cut || AtOrBefore(OrderKey(s), c, cut_key, cut_id - 1)) {", 0),
    # The one top-k cut selection (general path and flat rows) keeping the (K+1)-th too.
    ("gpu-topk-cut-keeps-one-more", "cuda/kernels/selection.cuh",
     "static_cast<unsigned long long>(K - 1));", "static_cast<unsigned long long>(K));", 0),
    # The flat rows' top-k cut fed -inf / T (NaN where T = +inf) as a kept score.
    ("gpu-flat-cut-scores-nan", "cuda/kernels/split_finish.cuh",
     "return v == kNegInf ? kNegInf : v / T;", "return v / T;", 0),
    # Issue 47: tensor-parallel logits shards read in place.
    ("gpu-shard-walker-boundary", "cuda/sampling_kernels.cuh",
     "while (c >= end_ && s_ + 1 < p_.num_shards) {", "while (c > end_ && s_ + 1 < p_.num_shards) {", 0),
    ("gpu-shard-run-straddles", "cuda/sampling_kernels.cuh",
     "if (lo >= shard.col_begin && lo + n <= shard.col_end) {",
     "if (lo >= shard.col_begin && lo < shard.col_end) {", 0),
    # Issue 46: the StepOutput written by the device.
    ("gpu-output-ignores-planned-failure", "cuda/step_output.cu",
     "bool failed = d.failed != 0;", "bool failed = false;", 0),
    ("gpu-output-decode-emits-past-rejection", "cuda/step_output.cu",
     "if (j + 1 == d.rows || !r.accepted) break;", "if (j + 1 == d.rows) break;", 0),
]

# GPU mutants that plant a race no test's results need show (the data usually lands in time):
# mutate_gpu.sh also runs these under compute-sanitizer racecheck with this gtest filter, and
# counts its hazards as failures. (gpu-stream-skips-the-wait survived the tests once grid-constant
# parameters shortened the chunk's chain; racecheck reported 24 hazards on it, H100, issue 49.)
GPU_RACECHECK = {
    "gpu-stream-skips-the-wait": "*SplitStreamKernelEqualsTheChunkBlocksOnTwoChunks*",
    "gpu-stream-update-copy-overlaps-readback": "*SplitStreamKernelEqualsTheChunkBlocksOnSevenChunks*",
}

# Mutants that no test of the contract can catch, and why (see their entries).
EQUIVALENT = {"no-histogram-fallback": "a 1-ulp tie of float64 sums (SPEC 3.6 at rounding level)"}


def apply(path, old, new, nth):
    text = path.read_text()
    start = -1
    for _ in range(nth + 1):
        start = text.find(old, start + 1)
        if start < 0:
            return None, text
    return text[:start] + new + text[start + len(old):], text


def gpu_pack(argv):
    """Builds each GPU mutant's cuda_backend_test into .device-pack/mutants/ID."""
    out = ROOT / ".device-pack" / "mutants"
    subprocess.run(["rm", "-rf", str(out)], check=True)
    out.mkdir(parents=True)
    pack = ROOT.parent / "shared" / "tools" / "device-pack"
    # The unmutated test first: the runner counts only failures beyond its own.
    subprocess.run(["bazel", "build", "-c", "opt", "//cuda:cuda_backend_test"], cwd=ROOT,
                   check=True, capture_output=True)
    subprocess.run([str(pack), str(out / "baseline"), "bazel-bin/cuda/cuda_backend_test"],
                   cwd=ROOT, check=True, capture_output=True)
    for mid, file, old, new, nth in GPU_MUTANTS:
        if argv and mid not in argv:
            continue
        path = ROOT / file
        mutated, original = apply(path, old, new, nth)
        if mutated is None:
            print(f"STALE    {mid}: its text is no longer in {file}", flush=True)
            continue
        try:
            path.write_text(mutated)
            built = subprocess.run(["bazel", "build", "-c", "opt", "//cuda:cuda_backend_test"],
                                   cwd=ROOT, capture_output=True, text=True)
            if built.returncode == 0:
                subprocess.run([str(pack), str(out / mid), "bazel-bin/cuda/cuda_backend_test"],
                               cwd=ROOT, check=True, capture_output=True)
        finally:
            path.write_text(original)
        if built.returncode == 0 and mid in GPU_RACECHECK:
            (out / mid / "racecheck").write_text(GPU_RACECHECK[mid] + "\n")
        print(f"packed   {mid}" if built.returncode == 0 else f"NOBUILD  {mid}", flush=True)
    write_tarball(out)
    return 0


def write_tarball(out):
    """The binaries alone, ID/bin/cuda_backend_test, in one xz stream next to `out`: a large
    dictionary finds the mutants' common bytes across files."""
    names = sorted(d.name for d in out.iterdir() if (d / "bin" / "cuda_backend_test").exists())
    extra = [f"{n}/racecheck" for n in names if (out / n / "racecheck").exists()]
    tar = subprocess.Popen(["tar", "-C", str(out), "-cf", "-"] +
                           [f"{n}/bin/cuda_backend_test" for n in names] + extra,
                           stdout=subprocess.PIPE)
    with open(out.parent / "mutants.tar.xz", "wb") as f:
        subprocess.run(["xz", "-9e", "-T2"], stdin=tar.stdout, stdout=f, check=True)
    if tar.wait() != 0:
        raise SystemExit("mutate: tar of the mutants failed")


def main(argv):
    if "--list" in argv:
        for m in MUTANTS:
            print(f"{m[0]:28} {m[1]}")
        for m in GPU_MUTANTS:
            print(f"{m[0]:28} {m[1]} (GPU)")
        return 0
    if "--check" in argv:
        # A refactor that moves a mutant's text makes it stale silently until someone runs the
        # mutants; CI checks the texts instead (no builds).
        stale = [m[0] for m in MUTANTS + GPU_MUTANTS if m[2] not in (ROOT / m[1]).read_text()]
        for mid in stale:
            print(f"STALE    {mid}: its text is no longer in its file")
        print(f"mutants: {len(MUTANTS) + len(GPU_MUTANTS) - len(stale)} of "
              f"{len(MUTANTS) + len(GPU_MUTANTS)} still apply")
        return len(stale)
    if "--gpu-pack" in argv:
        return gpu_pack([a for a in argv if a != "--gpu-pack"])
    chosen = [m for m in MUTANTS if not argv or m[0] in argv]
    survivors, stale, equivalent = [], [], []
    for mid, file, old, new, tests, nth in chosen:
        path = ROOT / file
        mutated, original = apply(path, old, new, nth)
        if mutated is None:
            print(f"STALE    {mid}: its text is no longer in {file}", flush=True)
            stale.append(mid)
            continue
        try:
            path.write_text(mutated)
            run = subprocess.run(["bazel", "test", *tests, "--test_tag_filters=-gpu",
                                  "--build_tests_only", "--test_output=summary", "--noshow_progress"],
                                 cwd=ROOT, capture_output=True, text=True)
        finally:
            path.write_text(original)
        out = run.stdout + run.stderr
        failed = [line.split()[0] for line in out.splitlines()
                  if line.startswith("//") and (" FAILED" in line or " TIMEOUT" in line)]
        if run.returncode == 0 and mid in EQUIVALENT:
            print(f"equivalent {mid}: survives, as expected ({EQUIVALENT[mid]})", flush=True)
            equivalent.append(mid)
        elif run.returncode == 0:
            print(f"SURVIVED {mid} ({file})", flush=True)
            survivors.append(mid)
        elif failed:
            print(f"caught   {mid} by {', '.join(failed)}", flush=True)
        else:
            # A mutant that does not build (or a Bazel error) says nothing about the tests.
            tail = " | ".join(out.strip().splitlines()[-3:])
            print(f"NOBUILD  {mid}: {tail}", flush=True)
            stale.append(mid)
    print(f"{len(chosen) - len(survivors) - len(stale) - len(equivalent)} caught, "
          f"{len(survivors)} survived, {len(equivalent)} equivalent"
          + (f" ({', '.join(survivors)})" if survivors else "")
          + (f", {len(stale)} stale or not building ({', '.join(stale)})" if stale else ""))
    return len(survivors) + len(stale)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
