#!/usr/bin/env bash
# Issue 28: the layering, checked. Bazel refuses a dependency on a target its package's
# visibility (//:*_users, see the root BUILD.bazel) does not admit; this test checks what the
# visibility lists cannot: that every package keeps a layer's default, that no code of a lower
# layer includes a higher one or a library its layer may not use (system headers need no
# target), and that the client library includes nothing of samplerd's own but proto/ and
# client/shm_buffer.
set -uo pipefail
fail=0
bad() { echo "LAYERS: $*"; fail=1; }
for pkg in sampler pipeline cuda server client; do
  grep -q 'default_visibility = \["//:'"$pkg"'_users"\]' "$pkg/BUILD.bazel" ||
    bad "$pkg/BUILD.bazel does not default to //:${pkg}_users"
done
for pkg in bench fuzz tests; do
  grep -q 'default_visibility' "$pkg/BUILD.bazel" && bad "$pkg/BUILD.bazel sets a default visibility"
done
# forbid DIR WHAT: no non-test source under DIR has an `#include WHAT...` line (WHAT an
# extended regex; tests of a package may reach higher: *_test.cc are skipped).
forbid() {
  local hits
  hits=$(grep -RlE "#include $2" "$1" --include='*.h' --include='*.cc' --include='*.cuh' --include='*.cu' |
         grep -v '_test\.cc$' || true)
  [[ -z $hits ]] || bad "$1 includes $2: $hits"
}
# Who may include whom.
forbid sampler '"(pipeline|cuda|server|client)/'
forbid pipeline '"(cuda|server|client)/'
forbid cuda '"(pipeline|server|client)/'
forbid server '"client/'
# Outside libraries a layer must not reach (issue 48): the core (sampler/) includes no gRPC,
# protobuf, generated protos, CUDA or NCCL header; pipeline/ no gRPC, CUDA or NCCL; cuda/ no
# gRPC or protos. (Bazel's visibility refuses the targets; system headers need this check.)
forbid sampler '[<"](grpc|grpcpp|google/protobuf|samplerd/v1|cuda|nccl|openssl)'
forbid pipeline '[<"](grpc|grpcpp|cuda|nccl|openssl)'
forbid cuda '[<"](grpc|grpcpp|google/protobuf|samplerd/v1)'
for f in client/sampler_client.h client/sampler_client.cc client/shm_buffer.h client/shm_buffer.cc; do
  own=$(grep -oE '#include "[a-z_]+/' "$f" | grep -vE '"(absl|grpc|grpcpp|google|samplerd|client)/' || true)
  [[ -z $own ]] || bad "$f includes samplerd code outside the client library: $own"
done
(( fail == 0 )) && echo "layers: every rule holds"
exit $fail
