#include "sampler/field_checks.h"

#include "absl/strings/str_cat.h"

namespace samplerd {

absl::Status FieldError(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

absl::Status CheckTokenIds(const std::vector<int32_t>& ids, int32_t vocab_size, bool allow_none,
                           absl::string_view field, absl::string_view suffix) {
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (allow_none && id == -1) continue;
    if (id < 0 || id >= vocab_size) {
      return FieldError(absl::StrCat(field, suffix, "[", i, "]"),
                        absl::StrCat("token id ", id, " is outside [0, vocab_size = ", vocab_size,
                                     ")", allow_none ? " and is not -1" : ""));
    }
  }
  return absl::OkStatus();
}

}  // namespace samplerd
