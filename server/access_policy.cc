#include "server/access_policy.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grpc/grpc_security_constants.h"
#include "grpcpp/security/auth_context.h"

namespace samplerd {

AccessPolicy::AccessPolicy(const std::vector<std::string>& allowed_identities, bool mutual_tls)
    : restricted_(!allowed_identities.empty()),
      mutual_tls_(mutual_tls),
      allowed_(allowed_identities.begin(), allowed_identities.end()) {}

std::string AccessPolicy::ScopePrefix(const grpc::ServerContext& context) const {
  if (!mutual_tls_) return "";
  const std::vector<std::string> identities = Identities(context);
  return identities.empty() ? "" : absl::StrCat("cert:", identities.front(), "/");
}

std::vector<std::string> AccessPolicy::Identities(const grpc::ServerContext& context) {
  std::vector<std::string> out;
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return out;
  for (const grpc::string_ref& san : auth->FindPropertyValues(GRPC_X509_SAN_PROPERTY_NAME)) {
    out.emplace_back(san.data(), san.size());
  }
  return out;
}

bool AccessPolicy::Privileged(const grpc::ServerContext& context) const {
  if (!restricted_ || absl::StartsWith(context.peer(), "unix:")) return true;
  for (const std::string& identity : Identities(context)) {
    if (allowed_.contains(identity)) return true;
  }
  return false;
}

absl::Status AccessPolicy::CheckPrivileged(const grpc::ServerContext& context,
                                           absl::string_view rpc) const {
  if (Privileged(context)) return absl::OkStatus();
  const std::vector<std::string> identities = Identities(context);
  return absl::PermissionDeniedError(absl::StrCat(
      rpc, ": the client certificate's identities (",
      identities.empty() ? "none" : absl::StrJoin(identities, ", "),
      ") are not in --tls_allowed_clients; such clients may only sample with inline logits"));
}

bool AccessPolicy::InlineOnly(const v1::Tensor& logits) {
  if (!logits.ready_event().empty()) return false;  // another process's CUDA event
  for (const v1::Tensor& shard : logits.shards()) {
    if (!InlineOnly(shard)) return false;
  }
  switch (logits.source_case()) {
    case v1::Tensor::kData:
    case v1::Tensor::kValues:
    case v1::Tensor::SOURCE_NOT_SET:
      return true;
    default:
      return false;
  }
}

}  // namespace samplerd
