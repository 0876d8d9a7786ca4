// A fake model worker: a separate process that plays a model engine against a running samplerd.
//
//   fake_worker --target=127.0.0.1:PORT
//
// It makes seeded logits for a few requests, writes them into a POSIX shm region it registers
// (and sends one step inline, as bf16 bytes), and drives PREFILL (with prompt logprobs), DRAFT
// and DECODE steps (drafts from the server's pool, and dense drafts sent inline) through
// SampleStream and Sample. Every response is checked bitwise against the CPU backend run in
// this process on the same inputs. Exits 0 when all agree, 1 with the first difference.
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/sampler_client.h"
#include "google/protobuf/util/message_differencer.h"
#include "sampler/dtype.h"
#include "tests/in_process.h"

namespace samplerd {
namespace {

constexpr int kVocab = 1000;
constexpr int kCols = 1024;  // padded vocabulary
constexpr int kRequests = 4;
constexpr int kMaxRows = 32;

class FakeWorker {
 public:
  explicit FakeWorker(std::unique_ptr<SamplerClient> client, std::unique_ptr<CpuBackend> local,
                      std::unique_ptr<ShmBuffer> shm, std::string buffer)
      : client_(std::move(client)), local_(std::move(local)), shm_(std::move(shm)),
        buffer_(std::move(buffer)), rng_(2026) {}

  // Fresh logits for `rows` rows, written to the shm region (row-major, kCols floats a row).
  // `like(r)` may name an earlier row (a draft row) that row r should resemble, else null.
  std::vector<float> WriteLogits(int rows, const std::function<const float*(int)>& like = {}) {
    std::normal_distribution<float> normal(0.0f, 2.0f);
    std::normal_distribution<float> noise(0.0f, 0.7f);
    std::vector<float> logits(static_cast<size_t>(rows) * kCols);
    for (int r = 0; r < rows; ++r) {
      const float* base = like ? like(r) : nullptr;
      for (int c = 0; c < kCols; ++c) {
        logits[r * kCols + c] = base != nullptr ? base[c] + noise(rng_) : normal(rng_);
      }
    }
    for (int r = 0; r < rows; ++r) {
      for (int c = kVocab; c < kCols; ++c) logits[r * kCols + c] = std::nanf("");  // padding
    }
    std::memcpy(shm_->data(), logits.data(), logits.size() * sizeof(float));
    return logits;
  }

  // The step with shm logits for the server, and the same with inline bytes for the check.
  void SetLogits(v1::SampleRequest& remote, v1::SampleRequest& local, int rows,
                 const std::vector<float>& logits) {
    for (v1::SampleRequest* r : {&remote, &local}) {
      v1::Tensor* t = r->mutable_logits();
      t->set_dtype(v1::FLOAT32);
      t->set_rows(rows);
      t->set_cols(kCols);
    }
    remote.mutable_logits()->mutable_buffer()->set_name(buffer_);
    local.mutable_logits()->set_data(logits.data(), logits.size() * sizeof(float));
  }

  bool Check(const std::string& what, const absl::StatusOr<v1::SampleResponse>& got,
             const v1::SampleRequest& local_request) {
    ++checked_;
    if (!got.ok()) {
      std::cerr << what << ": server call failed: " << got.status() << "\n";
      return false;
    }
    auto want = RunInProcess(*local_, local_request);
    if (!want.ok()) {
      std::cerr << what << ": in-process run failed: " << want.status() << "\n";
      return false;
    }
    v1::SampleResponse server = *got;
    server.clear_timing();
    if (server.has_error()) {
      std::cerr << what << ": step error " << server.error().message() << "\n";
      return false;
    }
    std::string diff;
    google::protobuf::util::MessageDifferencer differencer;
    differencer.ReportDifferencesToString(&diff);
    if (!differencer.Compare(*want, server)) {
      std::cerr << what << ": server and in-process backend differ:\n" << diff << "\n";
      return false;
    }
    for (const auto& r : server.results()) {
      if (r.has_status() && r.status().code() != 0) {
        std::cerr << what << ": request " << r.request_id() << " failed: " << r.status().message()
                  << "\n";
        return false;
      }
      tokens_ += r.token_ids_size();
    }
    return true;
  }


  static void Params(v1::SamplingParams* p, int i) {
    p->set_temperature(0.6f + 0.2f * i);
    if (i % 2 == 0) p->set_top_p(0.9f);
    if (i % 3 == 0) p->set_top_k(40);
    p->set_top_logprobs(3);
    p->set_seq_seed(1000 + i);
    p->set_frequency_penalty(0.1f);
  }

  bool Run() {
    auto stream = client_->OpenStream();
    if (!stream.ok()) {
      std::cerr << "OpenStream: " << stream.status() << "\n";
      return false;
    }
    // PREFILL: each request's last prompt row is sampled, its other rows give prompt logprobs.
    const int prompt_rows = 3;
    {
      const int rows = kRequests * (prompt_rows + 1);
      const std::vector<float> logits = WriteLogits(rows);
      v1::SampleRequest remote, local;
      remote.set_step_id(1);
      v1::SamplerInputs* in = remote.mutable_inputs();
      in->set_kind(v1::PREFILL);
      in->set_vocab_size(kVocab);
      in->set_compute_sum_smaller_probs(true);
      for (int i = 0; i < kRequests; ++i) {
        v1::RequestInputs* r = in->add_requests();
        r->set_request_id(absl::StrCat("seq-", i));
        r->set_row(i * (prompt_rows + 1) + prompt_rows);
        r->set_sample_position(prompt_rows + 1);
        r->set_prompt_first_row(i * (prompt_rows + 1));
        for (int k = 0; k < prompt_rows; ++k) r->add_prompt_targets((7 * i + k) % kVocab);
        for (int k = 0; k < prompt_rows + 1; ++k) r->add_prompt_token_ids((7 * i + k) % kVocab);
        Params(r->mutable_params(), i);
        history_[i].assign(r->prompt_token_ids().begin(), r->prompt_token_ids().end());
      }
      local = remote;
      SetLogits(remote, local, rows, logits);
      auto got = (*stream)->Step(remote);
      if (!Check("prefill", got, local)) return false;
      for (int i = 0; i < kRequests; ++i) outputs_[i].push_back(got->results(i).token_ids(0));
    }
    // Decode loop: a DRAFT step (2 drafts each, into the pool), then a DECODE step (q = 3).
    for (int round = 0; round < 5; ++round) {
      std::vector<std::vector<int32_t>> drafts(kRequests);
      std::vector<float> draft_logits;
      {
        const int rows = kRequests * 2;
        const std::vector<float> logits = WriteLogits(rows);
        draft_logits = logits;
        v1::SampleRequest remote, local;
        remote.set_step_id(10 + 2 * round);
        v1::SamplerInputs* in = remote.mutable_inputs();
        in->set_kind(v1::DRAFT);
        in->set_vocab_size(kVocab);
        for (int i = 0; i < kRequests; ++i) {
          v1::RequestInputs* r = in->add_requests();
          r->set_request_id(absl::StrCat("seq-", i));
          r->add_rows(2 * i);
          r->add_rows(2 * i + 1);
          r->add_draft_indices(1);
          r->add_draft_indices(2);
          r->set_sample_position(static_cast<int64_t>(prompt_rows + 1 + outputs_[i].size()));
          Params(r->mutable_params(), i);
          r->mutable_output_token_ids()->Add(outputs_[i].begin(), outputs_[i].end());
        }
        local = remote;
        SetLogits(remote, local, rows, logits);
        auto got = (*stream)->Step(remote);
        if (!Check(absl::StrCat("draft ", round), got, local)) return false;
        for (int i = 0; i < kRequests; ++i) {
          drafts[i].assign(got->results(i).token_ids().begin(), got->results(i).token_ids().end());
        }
      }
      {
        const int q = 3, rows = kRequests * q;
        // The target resembles the draft model on the verified rows, so drafts are often
        // accepted (and sometimes not).
        const std::vector<float> logits = WriteLogits(rows, [&](int r) -> const float* {
          const int i = r / q, j = r % q;
          return j < q - 1 ? draft_logits.data() + static_cast<size_t>(2 * i + j) * kCols : nullptr;
        });
        v1::SampleRequest remote, local;
        remote.set_step_id(11 + 2 * round);
        v1::SamplerInputs* in = remote.mutable_inputs();
        in->set_kind(v1::DECODE);
        in->set_vocab_size(kVocab);
        in->set_compute_sum_smaller_probs(true);
        for (int i = 0; i < kRequests; ++i) {
          v1::RequestInputs* r = in->add_requests();
          r->set_request_id(absl::StrCat("seq-", i));
          r->set_first_row(q * i);
          r->set_num_rows(q);
          r->set_sample_position(static_cast<int64_t>(prompt_rows + 1 + outputs_[i].size()));
          r->mutable_draft_token_ids()->Add(drafts[i].begin(), drafts[i].end());
          r->mutable_output_token_ids()->Add(outputs_[i].begin(), outputs_[i].end());
          r->mutable_prompt_token_ids()->Add(history_[i].begin(), history_[i].end());
          Params(r->mutable_params(), i);
        }
        local = remote;
        SetLogits(remote, local, rows, logits);
        auto got = (*stream)->Step(remote);
        if (!Check(absl::StrCat("decode ", round), got, local)) return false;
        for (int i = 0; i < kRequests; ++i) {
          for (int32_t t : got->results(i).token_ids()) outputs_[i].push_back(t);
          accepted_ += got->results(i).num_accepted();
        }
      }
    }
    if (absl::Status closed = (*stream)->Close(); !closed.ok()) {
      std::cerr << "stream close: " << closed << "\n";
      return false;
    }
    // One unary DECODE step with bf16 logits and dense draft logprobs, all inline.
    {
      const int q = 2;
      std::normal_distribution<float> normal(0.0f, 2.0f);
      std::vector<uint16_t> bf16(static_cast<size_t>(q) * kCols);
      for (uint16_t& v : bf16) v = FloatToBFloat16(normal(rng_));
      v1::SampleRequest request;
      request.set_step_id(99);
      v1::Tensor* t = request.mutable_logits();
      t->set_dtype(v1::BFLOAT16);
      t->set_rows(q);
      t->set_cols(kCols);
      t->set_data(bf16.data(), bf16.size() * 2);
      v1::SamplerInputs* in = request.mutable_inputs();
      in->set_kind(v1::DECODE);
      in->set_vocab_size(kVocab);
      v1::RequestInputs* r = in->add_requests();
      r->set_request_id("inline");
      r->set_num_rows(q);
      r->add_draft_token_ids(5);
      Params(r->mutable_params(), 1);
      v1::Tensor* d = r->mutable_draft_logprobs();
      d->set_rows(1);
      d->set_cols(kVocab);
      const float uniform = -std::log(static_cast<float>(kVocab));
      for (int c = 0; c < kVocab; ++c) d->mutable_values()->add_values(uniform);
      if (!Check("unary inline bf16 decode", client_->Sample(request), request)) return false;
    }
    std::cout << "fake_worker: " << checked_ << " steps, " << tokens_ << " tokens ("
              << accepted_ << " drafts accepted) agree bitwise with the in-process backend\n";
    return true;
  }

 private:
  std::unique_ptr<SamplerClient> client_;
  std::unique_ptr<CpuBackend> local_;
  std::unique_ptr<ShmBuffer> shm_;
  const std::string buffer_;
  std::mt19937_64 rng_;
  std::vector<int32_t> history_[kRequests];
  std::vector<int32_t> outputs_[kRequests];
  int checked_ = 0;
  int64_t tokens_ = 0;
  int accepted_ = 0;
};

int Main(int argc, char** argv) {
  std::string target;
  for (int i = 1; i < argc; ++i) {
    if (absl::StartsWith(argv[i], "--target=")) target = std::string(argv[i]).substr(9);
  }
  if (target.empty()) {
    std::cerr << "usage: fake_worker --target=HOST:PORT\n";
    return 2;
  }
  auto client = SamplerClient::Connect(target);
  auto local = CpuBackend::Create({.num_threads = 1});
  const std::string buffer = absl::StrCat("fake-worker-", getpid());
  auto shm = ShmBuffer::Create("/samplerd-" + buffer, int64_t{kMaxRows} * kCols * 4);
  if (!client.ok() || !local.ok() || !shm.ok()) {
    std::cerr << "setup failed\n";
    return 1;
  }
  if (absl::Status s = (*client)->RegisterShm(buffer, **shm); !s.ok()) {
    std::cerr << "RegisterShm: " << s << "\n";
    return 1;
  }
  FakeWorker worker(std::move(*client), std::move(*local), std::move(*shm), buffer);
  return worker.Run() ? 0 : 1;
}

}  // namespace
}  // namespace samplerd

int main(int argc, char** argv) { return samplerd::Main(argc, argv); }
