#include "sampler/token_updates.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "sampler/field_checks.h"
#include "sampler/status_macros.h"
#include "sampler/token_scan.h"

namespace samplerd {
namespace {

// Whether the history (output then drafts) ends with `prefix`.
bool HistoryEndsWith(absl::Span<const int32_t> output, absl::Span<const int32_t> drafts,
                     absl::Span<const int32_t> prefix) {
  const size_t n = prefix.size();
  if (n > output.size() + drafts.size()) return false;
  for (size_t i = 0; i < n; ++i) {
    // Element i of prefix against element (len - n + i) of the concatenated history.
    const size_t at = output.size() + drafts.size() - n + i;
    const int32_t h = at < output.size() ? output[at] : drafts[at - output.size()];
    if (h != prefix[i]) return false;
  }
  return true;
}

TokenUpdate Entry(int32_t token, int32_t flags) {
  TokenUpdate u;
  u.token = token;
  u.flags = flags;
  return u;
}

// Entries of one token merged into one: bans win (a banned token is -inf whatever else applies),
// biases add, history counts add. Entries of the same token keep their order of appending
// (stable sort), so the float sums are the same on every call.
// The first bias of a kind is taken as sent (a -0.0 bias stays -0.0), later ones add.
void Merge(TokenUpdate& into, const TokenUpdate& u) {
  if (u.flags & kUpdateBias) into.bias = (into.flags & kUpdateBias) ? into.bias + u.bias : u.bias;
  if (u.flags & kUpdateLateBias) {
    into.late_bias = (into.flags & kUpdateLateBias) ? into.late_bias + u.late_bias : u.late_bias;
  }
  into.flags |= u.flags;
  into.count += u.count;
}

// SPEC 3 step 3: a repeat longer than this counts as this long (so a row costs at most
// context x 50 comparisons).
constexpr int32_t kDryMaxMatch = 50;

}  // namespace

std::vector<TokenUpdate> DryUpdates(const DryPenalty& dry, absl::Span<const int32_t> prompt,
                                    absl::Span<const int32_t> output,
                                    absl::Span<const int32_t> drafts_before) {
  std::vector<TokenUpdate> out;
  if (!dry.on()) return out;
  // The context c is prompt, output, drafts, cut to the last `range` tokens; it is read where it
  // lies (no copy: a 4,096-token context is 16 KB a row), as up to three contiguous pieces.
  const size_t total = prompt.size() + output.size() + drafts_before.size();
  const size_t n = dry.range > 0 ? std::min(total, static_cast<size_t>(dry.range)) : total;
  if (n < 2) return out;
  absl::Span<const int32_t> pieces[3];
  int num_pieces = 0;
  {
    size_t skip = total - n;  // the range cut
    for (absl::Span<const int32_t> part : {prompt, output, drafts_before}) {
      const size_t drop = std::min(skip, part.size());
      skip -= drop;
      if (part.size() > drop) pieces[num_pieces++] = part.subspan(drop);
    }
  }
  auto breaker = [&dry](int32_t t) {
    return std::binary_search(dry.breakers.begin(), dry.breakers.end(), t);
  };
  // The context's end, which every match is compared with, copied out of the pieces in order:
  // c[n - 1 - m] = end[kEnd - 1 - m] for m < tail_size.
  constexpr size_t kEnd = kDryMaxMatch + 1;
  int32_t end[kEnd];
  size_t tail_size = 0;
  for (int p = num_pieces - 1; p >= 0 && tail_size < kEnd; --p) {
    for (size_t k = pieces[p].size(); k > 0 && tail_size < kEnd; --k) {
      end[kEnd - 1 - tail_size++] = pieces[p][k - 1];
    }
  }
  auto tail = [&end](int32_t m) { return end[kEnd - 1 - m]; };
  const int32_t last = tail(0);
  if (breaker(last)) return out;
  // A match stops at the cap, or where the context's end reaches a breaker (the same for every
  // candidate, so found once): m grows while m < cap.
  int32_t cap = std::min<int32_t>(kDryMaxMatch, static_cast<int32_t>(tail_size));
  for (int32_t m = 1; m < cap; ++m) {
    if (breaker(tail(m))) cap = m;
  }
  // (the token after a match, the match's length) for every match long enough to count.
  absl::InlinedVector<std::pair<int32_t, int32_t>, 16> matches;
  // Candidate: c[i] == last at pieces[p][k], with a successor in the context.
  auto match_at = [&](int p, size_t k, int32_t next) {
    if (breaker(next)) return;
    // m grows while c[i - m] == tail[m]: backwards from (p, k), a piece's run at a time
    // (i - m >= 0 is running out of pieces).
    int32_t m = 1;
    while (m < cap) {
      const int32_t* data = pieces[p].data();
      const int32_t run = static_cast<int32_t>(std::min<size_t>(cap - m, k));
      const int32_t r = static_cast<int32_t>(CommonSuffix(data + k, end + kEnd - m, run));
      m += r;
      if (r < run || static_cast<size_t>(run) < k || p == 0) break;
      k = pieces[--p].size();  // this piece is used up: on into the one before
    }
    if (m >= dry.allowed_length) matches.emplace_back(next, m);
  };
  // Candidates: c[i] == last with a successor (the context's last token has none).
  TokenPositions at;
  for (int p = 0; p < num_pieces; ++p) {
    const int32_t* data = pieces[p].data();
    const size_t size = pieces[p].size();
    at.clear();
    FindToken(data, size, last, at);
    for (uint32_t j : at) {
      if (j + 1 < size) {
        match_at(p, j, data[j + 1]);
      } else if (p + 1 < num_pieces) {
        match_at(p, j, pieces[p + 1][0]);
      }
    }
  }
  if (matches.empty()) return out;
  // M[t]: the longest match followed by t.
  std::sort(matches.begin(), matches.end(), [](const auto& a, const auto& b) {
    return a.first < b.first || (a.first == b.first && a.second > b.second);
  });
  for (size_t j = 0; j < matches.size(); ++j) {
    if (j > 0 && matches[j].first == matches[j - 1].first) continue;
    // In float64, rounded to float32 once; subtracting it is adding its negation exactly.
    const double penalty = static_cast<double>(dry.multiplier) *
                           std::pow(static_cast<double>(dry.base),
                                    static_cast<double>(matches[j].second - dry.allowed_length));
    TokenUpdate u = Entry(matches[j].first, kUpdateLateBias);
    u.late_bias = -static_cast<float>(penalty);
    out.push_back(u);
  }
  return out;
}

namespace {

// The entries of a row that are not the shared history: steps 2b-d, the drafts' history
// (penalised and counted, DECODE rows), DRY. Unsorted.
std::vector<TokenUpdate> RowOwnEntries(const TokenAdjustments& adjustments,
                                       const PenaltySettings& penalties,
                                       absl::Span<const int32_t> prompt,
                                       absl::Span<const int32_t> output,
                                       absl::Span<const int32_t> drafts_before) {
  std::vector<TokenUpdate> all;
  // Step 2b: a bad word of one token is always banned; a longer one when the history ends with
  // all of it but its last token.
  for (const std::vector<int32_t>& word : adjustments.bad_words) {
    const absl::Span<const int32_t> prefix(word.data(), word.size() - 1);
    if (HistoryEndsWith(output, drafts_before, prefix)) all.push_back(Entry(word.back(), kUpdateBan));
  }
  // Step 2c: before min_tokens tokens of history, the stop ids are banned.
  if (static_cast<int64_t>(output.size() + drafts_before.size()) < adjustments.min_tokens) {
    for (int32_t t : adjustments.stop_token_ids) all.push_back(Entry(t, kUpdateBan));
  }
  // Step 2d.
  for (const auto& [t, bias] : adjustments.logit_bias) {
    TokenUpdate u = Entry(t, kUpdateBias);
    u.bias = bias;
    all.push_back(u);
  }
  // Step 3's history beyond the request's own: the drafts before this row (output history).
  if (penalties.on()) {
    for (int32_t t : drafts_before) {
      TokenUpdate u = Entry(t, kUpdatePenalize);
      u.count = 1;
      all.push_back(u);
    }
  }
  // Step 3's DRY, added after the penalties (kUpdateLateBias).
  std::vector<TokenUpdate> dry = DryUpdates(adjustments.dry, prompt, output, drafts_before);
  all.insert(all.end(), dry.begin(), dry.end());
  return all;
}

// Two lists sorted by token with one entry per token, as one: a token in both is merged as
// MergeTokenUpdates would (the sources never both hold a float bias of one kind for a token:
// logit_bias is one entry a token, DRY one, the history none, so the order is immaterial).
std::vector<TokenUpdate> MergeSorted(const std::vector<TokenUpdate>& a,
                                     const std::vector<TokenUpdate>& b) {
  std::vector<TokenUpdate> out;
  out.reserve(a.size() + b.size());
  size_t i = 0, j = 0;
  while (i < a.size() || j < b.size()) {
    if (j == b.size() || (i < a.size() && a[i].token < b[j].token)) {
      out.push_back(a[i++]);
    } else if (i == a.size() || b[j].token < a[i].token) {
      out.push_back(b[j++]);
    } else {
      out.push_back(a[i++]);
      Merge(out.back(), b[j++]);
    }
  }
  return out;
}

}  // namespace

std::vector<TokenUpdate> HistoryUpdates(absl::Span<const int32_t> prompt,
                                        absl::Span<const int32_t> output) {
  // The token ids sorted (4 bytes a token, in place), then one entry a distinct token: every
  // prompt or output token is penalised (repetition), output tokens are counted. The same
  // entries as merging one entry a token, at a fifth of the memory and without a stable sort's
  // buffer.
  std::vector<int32_t> p(prompt.begin(), prompt.end()), o(output.begin(), output.end());
  std::sort(p.begin(), p.end());
  std::sort(o.begin(), o.end());
  std::vector<TokenUpdate> out;
  size_t i = 0, j = 0;
  while (i < p.size() || j < o.size()) {
    const int32_t t = j == o.size() || (i < p.size() && p[i] < o[j]) ? p[i] : o[j];
    TokenUpdate u = Entry(t, kUpdatePenalize);
    while (i < p.size() && p[i] == t) ++i;
    while (j < o.size() && o[j] == t) {
      ++u.count;
      ++j;
    }
    out.push_back(u);
  }
  return out;
}

std::vector<TokenUpdate> RowTokenUpdates(const TokenAdjustments& adjustments,
                                         const PenaltySettings& penalties,
                                         const std::vector<TokenUpdate>& history,
                                         absl::Span<const int32_t> prompt,
                                         absl::Span<const int32_t> output,
                                         absl::Span<const int32_t> drafts_before) {
  std::vector<TokenUpdate> own = MergeTokenUpdates(
      RowOwnEntries(adjustments, penalties, prompt, output, drafts_before));
  if (!penalties.on() || history.empty()) return own;
  return MergeSorted(history, own);
}

std::vector<TokenUpdate> RowTokenUpdates(const TokenAdjustments& adjustments,
                                         const PenaltySettings& penalties,
                                         absl::Span<const int32_t> prompt,
                                         absl::Span<const int32_t> output,
                                         absl::Span<const int32_t> drafts_before) {
  const std::vector<TokenUpdate> history =
      penalties.on() ? HistoryUpdates(prompt, output) : std::vector<TokenUpdate>();
  return RowTokenUpdates(adjustments, penalties, history, prompt, output, drafts_before);
}

std::vector<TokenUpdate> MergeTokenUpdates(std::vector<TokenUpdate> entries) {
  std::stable_sort(entries.begin(), entries.end(),
                   [](const TokenUpdate& a, const TokenUpdate& b) { return a.token < b.token; });
  std::vector<TokenUpdate> out;
  for (const TokenUpdate& u : entries) {
    if (out.empty() || out.back().token != u.token) {
      out.push_back(u);
    } else {
      Merge(out.back(), u);
    }
  }
  return out;
}

std::vector<int32_t> DraftsBefore(const RequestInputs& inputs, StepKind kind, int32_t row_index) {
  std::vector<int32_t> drafts;
  if (kind != StepKind::kDecode) return drafts;
  for (int32_t k = 0; k < row_index && k < static_cast<int32_t>(inputs.draft_token_ids.size()); ++k) {
    if (inputs.draft_token_ids[k] >= 0) drafts.push_back(inputs.draft_token_ids[k]);
  }
  return drafts;
}

namespace {

// SPEC 2's checks of each adjustment, beside the code that turns it into updates (above). Each
// error names its field under `field` ("requests[i]").
// A token list's length against the server's limit (GetServerInfo limits.max_token_list).
absl::Status CheckListLength(size_t size, int32_t max_token_list, absl::string_view field,
                             absl::string_view suffix) {
  if (size <= static_cast<size_t>(max_token_list)) return absl::OkStatus();
  return FieldError(absl::StrCat(field, suffix),
                    absl::StrCat(size, " tokens exceed the server limit of ", max_token_list,
                                 " (GetServerInfo limits.max_token_list)"));
}

// A checked token list as a set: sorted, each id once (rows look ids up by binary search).
std::vector<int32_t> SortedUnique(std::vector<int32_t> ids) {
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

// A list of token ids (allowed ids, stop ids): its length, then each id in [0, V).
absl::Status CheckTokenList(const std::vector<int32_t>& ids, int32_t vocab_size,
                            int32_t max_token_list, absl::string_view field,
                            absl::string_view suffix) {
  RETURN_IF_ERROR(CheckListLength(ids.size(), max_token_list, field, suffix));
  return CheckTokenIds(ids, vocab_size, false, field, suffix);
}

// bad_words: no word empty, their tokens together within the limit, each id in [0, V).
absl::Status CheckBadWords(const std::vector<std::vector<int32_t>>& words, int32_t vocab_size,
                           int32_t max_token_list, absl::string_view field) {
  size_t tokens = 0;
  for (size_t w = 0; w < words.size(); ++w) {
    if (words[w].empty()) {
      return FieldError(absl::StrCat(field, ".params.bad_words[", w, "].token_ids"), "is empty");
    }
    tokens += words[w].size();
  }
  RETURN_IF_ERROR(CheckListLength(tokens, max_token_list, field, ".params.bad_words"));
  for (size_t w = 0; w < words.size(); ++w) {
    RETURN_IF_ERROR(CheckTokenIds(words[w], vocab_size, false, field,
                                  absl::StrCat(".params.bad_words[", w, "].token_ids")));
  }
  return absl::OkStatus();
}

// logit_bias: within the limit, each bias finite in [-100, 100], each key in [0, V) and named
// once. Returns the entries sorted by token.
absl::StatusOr<std::vector<std::pair<int32_t, float>>> CheckLogitBias(
    const std::vector<std::pair<int32_t, float>>& sent, int32_t vocab_size, int32_t max_token_list,
    absl::string_view field) {
  RETURN_IF_ERROR(CheckListLength(sent.size(), max_token_list, field, ".params.logit_bias"));
  auto entry = [&](int32_t token) { return absl::StrCat(field, ".params.logit_bias[", token, "]"); };
  for (const auto& [token, bias] : sent) {
    if (!(bias >= -100.0f && bias <= 100.0f)) {
      return FieldError(entry(token), absl::StrCat(bias, " is not a finite bias in [-100, 100]"));
    }
    if (token < 0 || token >= vocab_size) {
      return FieldError(entry(token), absl::StrCat("token id ", token,
                                                   " is outside [0, vocab_size = ", vocab_size,
                                                   ")"));
    }
  }
  std::vector<std::pair<int32_t, float>> sorted = sent;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i].first == sorted[i - 1].first) {
      return FieldError(entry(sorted[i].first), "names the token twice");
    }
  }
  return sorted;
}

// DRY's parameters (SPEC 2): the multiplier in [0, 100], the base in [1, 4], the allowed
// length >= 1, the range >= 0 (NaN fails every range check), the breakers as a token list.
absl::StatusOr<DryPenalty> CheckDry(const SamplingParams& params, int32_t vocab_size,
                                    int32_t max_token_list, absl::string_view request_field) {
  auto field = [&](absl::string_view name) {
    return absl::StrCat(request_field, ".params.", name);
  };
  DryPenalty dry;
  if (!(params.dry_multiplier >= 0.0f && params.dry_multiplier <= 100.0f)) {
    return FieldError(field("dry_multiplier"),
                      absl::StrCat(params.dry_multiplier, " is outside [0, 100]"));
  }
  dry.multiplier = params.dry_multiplier;
  if (params.dry_base.has_value()) {
    if (!(*params.dry_base >= 1.0f && *params.dry_base <= 4.0f)) {
      return FieldError(field("dry_base"), absl::StrCat(*params.dry_base, " is outside [1, 4]"));
    }
    dry.base = *params.dry_base;
  }
  if (params.dry_allowed_length.has_value()) {
    if (*params.dry_allowed_length < 1) {
      return FieldError(field("dry_allowed_length"),
                        absl::StrCat(*params.dry_allowed_length, " must be >= 1"));
    }
    dry.allowed_length = *params.dry_allowed_length;
  }
  if (params.dry_range < 0) {
    return FieldError(field("dry_range"), absl::StrCat(params.dry_range, " must be >= 0"));
  }
  dry.range = params.dry_range;
  RETURN_IF_ERROR(CheckTokenList(params.dry_sequence_breakers, vocab_size, max_token_list, request_field,
                                 ".params.dry_sequence_breakers"));
  dry.breakers = SortedUnique(params.dry_sequence_breakers);
  return dry;
}

}  // namespace

absl::StatusOr<TokenAdjustments> CheckAdjustments(const SamplingParams& params,
                                                  int32_t vocab_size, int32_t max_token_list,
                                                  const std::string& request_field) {
  RETURN_IF_ERROR(CheckTokenList(params.allowed_token_ids, vocab_size, max_token_list,
                                 request_field, ".params.allowed_token_ids"));
  RETURN_IF_ERROR(CheckTokenList(params.stop_token_ids, vocab_size, max_token_list,
                                 request_field, ".params.stop_token_ids"));
  if (params.min_tokens < 0) {
    return FieldError(request_field + ".params.min_tokens",
                      absl::StrCat(params.min_tokens, " must be >= 0"));
  }
  RETURN_IF_ERROR(CheckBadWords(params.bad_words, vocab_size, max_token_list, request_field));
  TokenAdjustments adj;
  ASSIGN_OR_RETURN(adj.logit_bias,
                   CheckLogitBias(params.logit_bias, vocab_size, max_token_list, request_field));
  adj.bad_words = params.bad_words;
  adj.min_tokens = params.min_tokens;
  adj.stop_token_ids = SortedUnique(params.stop_token_ids);
  ASSIGN_OR_RETURN(adj.dry, CheckDry(params, vocab_size, max_token_list, request_field));
  return adj;
}

}  // namespace samplerd
