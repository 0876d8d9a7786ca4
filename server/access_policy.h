// Who may do what over a TLS listener (issue 31). samplerd's state-changing rpcs (registering
// and unregistering buffers, creating and destroying groups, opening a step channel, listing
// the registrations) give a caller the server's memory and its view of other processes'
// memory; sampling with inline logits gives it only compute. With mutual TLS and an allowlist
// of client identities, a caller whose verified certificate names a listed identity may do
// everything; any other caller may sample with inline logits (and call GetServerInfo,
// KeepAlive, Release and the health service). Calls over the unix socket (its file mode is
// the guard) and every call when there is no allowlist are privileged.
//
//   AccessPolicy policy({"spiffe://cluster/ns/llm/sa/worker", "worker.llm.svc"});
//   if (absl::Status s = policy.CheckPrivileged(*context, "RegisterBuffer"); !s.ok()) ...
//   if (!policy.Privileged(*context)) { /* inline logits only */ }
#ifndef SAMPLERD_SERVER_ACCESS_POLICY_H_
#define SAMPLERD_SERVER_ACCESS_POLICY_H_

#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/server_context.h"
#include "samplerd/v1/sampler.pb.h"

namespace samplerd {

class AccessPolicy {
 public:
  // No allowlist: every caller is privileged.
  AccessPolicy() = default;
  // Privileged: callers whose client certificate has one of these subject alternative names
  // (DNS name, URI, e-mail address or IP address, compared as written). `mutual_tls`: clients
  // present certificates (--tls_client_ca_file), so calls have identities to scope by.
  AccessPolicy(const std::vector<std::string>& allowed_identities, bool mutual_tls);

  bool restricted() const { return restricted_; }
  // The caller's scope prefix: "cert:<first SAN>/" under mutual TLS, else "" (without looking
  // at the call's auth context, which costs an allocation a call).
  std::string ScopePrefix(const grpc::ServerContext& context) const;
  bool Privileged(const grpc::ServerContext& context) const;
  // OK, or PERMISSION_DENIED naming `rpc` and the caller's identities.
  absl::Status CheckPrivileged(const grpc::ServerContext& context, absl::string_view rpc) const;

  // The subject alternative names of the caller's verified client certificate (empty without
  // one).
  static std::vector<std::string> Identities(const grpc::ServerContext& context);
  // Whether a step reads only logits it carries (data or values, in every shard): what an
  // unprivileged caller may send.
  static bool InlineOnly(const v1::Tensor& logits);

 private:
  bool restricted_ = false;
  bool mutual_tls_ = false;
  absl::flat_hash_set<std::string> allowed_;
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_ACCESS_POLICY_H_
