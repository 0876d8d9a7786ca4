#!/usr/bin/env python3
"""Mutation testing (issue 27): plants one deliberate bug at a time, runs the tests, and prints
which bugs no test caught. Run by hand (each mutant rebuilds; not part of CI):

    python3 scripts/mutate.py                 # every CPU mutant
    python3 scripts/mutate.py residual-from-p half-exponent-bias   # some, by id
    python3 scripts/mutate.py --list

A mutant is a literal edit of one file (`old` must occur; `nth` picks among several
occurrences) and the Bazel tests that should catch it (a test target list keeps each run
short; `bazel test //... --test_tag_filters=-gpu` is the last word). The file is restored after
each mutant, whatever happens. Exit status: the number of survivors (0: every bug caught).
GPU mutants (kernels) are not in this list yet: they need the GPU machine.
"""
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
SAMPLER = ["//sampler:all"]
STATS = ["//tests:statistical_test"]

# id, file, old, new, tests, nth (0: the first occurrence)
MUTANTS = [
    # The review's table (issue 27).
    ("skip-min-p", "sampler/row_processor.cc",
     "if (!options.prompt_mode && params.min_p > 0.0f) ApplyMinP(params.min_p);",
     "if (false) ApplyMinP(params.min_p);", SAMPLER, 0),
    ("top-p-gt-to-ge", "sampler/row_processor.cc",
     "if (before / total_sum_ > limit) {", "if (before / total_sum_ >= limit) {", SAMPLER, 0),
    ("ties-by-higher-id", "sampler/row_kernels.cc",
     "(scores[a] == scores[b] && a < b)", "(scores[a] == scores[b] && a > b)", SAMPLER, 0),
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
    ("no-histogram-fallback", "sampler/row_processor.cc",
     "if (keep == candidates.size() && !by_rank && before / total_sum_ <= limit) {",
     "if (false) {", SAMPLER, 0),
    ("min-p-lt-to-le", "sampler/row_processor.cc",
     "weights_[kept_.back()] < min_p) kept_.pop_back();",
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
    ("min-p-cut-ge-to-gt", "sampler/row_processor.cc",
     "if (weights_[t] >= min_p && scores_[t] <= cut) {",
     "if (weights_[t] > min_p && scores_[t] <= cut) {", SAMPLER, 0),
]


def apply(path, old, new, nth):
    text = path.read_text()
    start = -1
    for _ in range(nth + 1):
        start = text.find(old, start + 1)
        if start < 0:
            return None, text
    return text[:start] + new + text[start + len(old):], text


def main(argv):
    if "--list" in argv:
        for m in MUTANTS:
            print(f"{m[0]:28} {m[1]}")
        return 0
    chosen = [m for m in MUTANTS if not argv or m[0] in argv]
    survivors, stale = [], []
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
        if run.returncode == 0:
            print(f"SURVIVED {mid} ({file})", flush=True)
            survivors.append(mid)
        elif failed:
            print(f"caught   {mid} by {', '.join(failed)}", flush=True)
        else:
            # A mutant that does not build (or a Bazel error) says nothing about the tests.
            tail = " | ".join(out.strip().splitlines()[-3:])
            print(f"NOBUILD  {mid}: {tail}", flush=True)
            stale.append(mid)
    print(f"{len(chosen) - len(survivors) - len(stale)} caught, {len(survivors)} survived"
          + (f" ({', '.join(survivors)})" if survivors else "")
          + (f", {len(stale)} stale or not building ({', '.join(stale)})" if stale else ""))
    return len(survivors) + len(stale)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
