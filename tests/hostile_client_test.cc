// Hostile and careless clients against the real samplerd in its own process (loopback, port 0,
// bounded): every class of fault found in the hardening issue, each refused with a clear error
// naming the field, after which the server still answers a normal step exactly. Each of these
// crashed, hung, misanswered or bloated the server before the hardening issue.
//
//   hostile_client_test SAMPLERD
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>

#include "client/sampler_client.h"
#include "client/shm_buffer.h"
#include "tests/server_process.h"
#include "tests/test_steps.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

std::string g_samplerd;

// A name unique to this test process, for shm objects under /dev/shm.
std::string ShmName(const std::string& what) {
  return "/samplerd-hostile-" + std::to_string(getpid()) + "-" + what;
}

class Hostile : public ::testing::Test {
 protected:
  void StartServer(std::vector<std::string> flags = {}) {
    flags.push_back("--threads=2");
    server_ = std::make_unique<ServerProcess>(g_samplerd, std::move(flags));
    ASSERT_TRUE(server_->Start().ok());
    client_ = Connect();
  }
  std::unique_ptr<SamplerClient> Connect() {
    ClientOptions options;
    options.timeout = std::chrono::milliseconds(10000);
    auto client = SamplerClient::Connect(server_->target(), options);
    EXPECT_TRUE(client.ok());
    return std::move(*client);
  }
  // The server is up, SERVING, and answers a normal step as it always does.
  void ExpectAlive() {
    auto serving = client_->IsServing();
    ASSERT_TRUE(serving.ok()) << serving.status();
    EXPECT_TRUE(*serving);
    auto reply = client_->Sample(SmallStep(99, 3));
    ASSERT_TRUE(reply.ok()) << reply.status();
    ASSERT_EQ(reply->results_size(), 3);
    for (const auto& r : reply->results()) {
      EXPECT_EQ(r.status().code(), 0) << r.status().message();
      EXPECT_EQ(r.token_ids_size(), 1);
    }
  }
  void TearDown() override {
    client_.reset();
    // SIGTERM after all the abuse: every step answered, exit 0.
    if (server_) EXPECT_EQ(server_->Stop(SIGTERM), 0);
  }
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<SamplerClient> client_;
};

// [rows, cols] float32 with a row_stride whose extent (((rows - 1) * stride + cols) * 4) wraps
// around 2^64 to 4 bytes: the 40-byte request that read far outside the message.
constexpr int64_t kWrappingStride = int64_t{1} << 62;

void SetWrappingTensor(v1::Tensor* t) {
  t->set_dtype(v1::FLOAT32);
  t->set_rows(2);
  t->set_cols(1);
  t->set_row_stride(kWrappingStride);
  t->set_data(std::string(4, '\0'));
}

TEST_F(Hostile, WrappingRowStrideInlineIsRefused) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  v1::SampleRequest request;
  SetWrappingTensor(request.mutable_logits());
  request.mutable_inputs()->set_kind(v1::PREFILL);
  request.mutable_inputs()->set_vocab_size(1);
  request.mutable_inputs()->add_requests()->set_row(1);
  EXPECT_LT(request.ByteSizeLong(), 48u);
  auto reply = client_->Sample(request);
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(reply.status().message()), HasSubstr("logits.row_stride"));
  ExpectAlive();
}

TEST_F(Hostile, WrappingRowStrideInShardsAndShmSliceIsRefused) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  v1::SampleRequest sharded = SmallStep(1, 1, 64);
  v1::Tensor logits = sharded.logits();
  sharded.mutable_logits()->Clear();
  SetWrappingTensor(sharded.mutable_logits()->add_shards());
  auto reply = client_->Sample(sharded);
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(reply.status().message()), HasSubstr("logits.shards[0].row_stride"));

  auto shm = ShmBuffer::Create(ShmName("stride"), 4096);
  ASSERT_TRUE(shm.ok());
  ASSERT_TRUE(client_->RegisterShm("stride", **shm).ok());
  v1::SampleRequest sliced = SmallStep(2, 1, 64);
  v1::Tensor* t = sliced.mutable_logits();
  t->Clear();
  t->set_dtype(v1::FLOAT32);
  t->set_rows(2);
  t->set_cols(1);
  t->set_row_stride(kWrappingStride);
  t->mutable_buffer()->set_name("stride");
  sliced.mutable_inputs()->set_vocab_size(1);
  sliced.mutable_inputs()->mutable_requests(0)->set_row(1);
  reply = client_->Sample(sliced);
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(reply.status().message()), HasSubstr("logits.row_stride"));
  ExpectAlive();
}

// Draft tensors are a request's own: their fault fails that request, the others are answered.
TEST_F(Hostile, WrappingRowStrideInDraftTensorsFailsOnlyItsRequest) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  v1::SampleRequest step = SmallStep(3, 6, 64);
  v1::SamplerInputs* in = step.mutable_inputs();
  in->set_kind(v1::DECODE);
  in->clear_requests();
  for (int i = 0; i < 3; ++i) {
    v1::RequestInputs* r = in->add_requests();
    r->set_request_id("d" + std::to_string(i));
    r->set_first_row(2 * i);
    r->set_num_rows(2);
    r->add_draft_token_ids(5);
    r->mutable_params()->set_seq_seed(7);
    v1::Tensor* q = i == 0 ? r->mutable_draft_logprobs()
                           : i == 1 ? r->mutable_draft_topn()->mutable_values()
                                    : r->mutable_draft_logprobs();
    if (i < 2) {
      SetWrappingTensor(q);
      q->set_rows(1);  // one draft: the stride is unused, so make the tensor need two rows
      q->set_rows(2);
      if (i == 1) r->mutable_draft_topn()->add_token_ids(5);
    } else {
      q->set_rows(1);
      q->set_cols(64);
      for (int c = 0; c < 64; ++c) q->mutable_values()->add_values(c == 5 ? 0.0f : -1e30f);
    }
  }
  auto reply = client_->Sample(step);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->results(0).status().code(), 3);
  EXPECT_THAT(reply->results(0).status().message(),
              HasSubstr("requests[0].draft_logprobs.row_stride"));
  EXPECT_EQ(reply->results(1).status().code(), 3);
  EXPECT_THAT(reply->results(1).status().message(),
              HasSubstr("requests[1].draft_topn.values.row_stride"));
  EXPECT_EQ(reply->results(2).status().code(), 0) << reply->results(2).status().message();
  ExpectAlive();
}

// A worker shrinks its registered object: the step that reads the lost bytes fails, the
// server does not (it used to die of SIGBUS).
TEST_F(Hostile, ShmObjectShrunkAfterRegistrationFailsOnlyTheStep) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  const std::string name = ShmName("shrink");
  auto shm = ShmBuffer::Create(name, 64 * 4 * 4);
  ASSERT_TRUE(shm.ok());
  for (int i = 0; i < 64 * 4; ++i) static_cast<float*>((*shm)->data())[i] = 0.01f * (i % 64);
  ASSERT_TRUE(client_->RegisterShm("shrink", **shm).ok());
  v1::SampleRequest step = SmallStep(4, 4, 64);
  step.mutable_logits()->clear_values();
  step.mutable_logits()->set_dtype(v1::FLOAT32);
  step.mutable_logits()->mutable_buffer()->set_name("shrink");
  auto before = client_->Sample(step);
  ASSERT_TRUE(before.ok()) << before.status();

  // The name is gone (RegisterShm unlinked it); the worker still has the object's descriptor.
  ASSERT_LT(shm_open(name.c_str(), O_RDWR, 0), 0);
  ASSERT_EQ(ftruncate((*shm)->fd(), 100), 0);  // rows 1-3 are gone
  for (int attempt = 0; attempt < 3; ++attempt) {
    auto after = client_->Sample(step);
    EXPECT_EQ(after.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(after.status().message()), HasSubstr("shrank"));
  }
  ExpectAlive();
}

// A FIFO never blocks RegisterBuffer (it used to pin a thread forever); links are not followed.
TEST_F(Hostile, FifoAndSymlinkAreRefusedAtOnce) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  const std::string fifo = ShmName("fifo");
  ASSERT_EQ(mkfifo(("/dev/shm" + fifo).c_str(), 0600), 0);
  v1::RegisterBufferRequest request;
  request.set_name("fifo");
  request.set_kind(v1::HOST_SHM);
  request.set_shm_name(fifo);
  request.set_byte_size(64);
  const auto start = std::chrono::steady_clock::now();
  const absl::Status status = client_->RegisterBuffer(request);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("not a regular"));
  unlink(("/dev/shm" + fifo).c_str());

  auto target = ShmBuffer::Create(ShmName("target"), 4096);
  ASSERT_TRUE(target.ok());
  const std::string link = ShmName("link");
  ASSERT_EQ(symlink(("/dev/shm" + (*target)->shm_name()).c_str(), ("/dev/shm" + link).c_str()), 0);
  request.set_name("link");
  request.set_shm_name(link);
  const absl::Status linked = client_->RegisterBuffer(request);
  EXPECT_EQ(linked.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(linked.message()), HasSubstr("symbolic link"));
  unlink(("/dev/shm" + link).c_str());
  ExpectAlive();
}

// Another user's object is refused unless the server was told to accept that uid.
TEST_F(Hostile, ShmObjectOfAnotherUserIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give an shm object to another uid";
  ASSERT_NO_FATAL_FAILURE(StartServer());
  const std::string name = ShmName("foreign");
  auto shm = ShmBuffer::Create(name, 4096);
  ASSERT_TRUE(shm.ok());
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(fchown(fd, 65534, 65534), 0);
  ASSERT_EQ(fchmod(fd, 0600), 0);
  close(fd);
  const absl::Status status = client_->RegisterShm("foreign", **shm);
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(status.message()), HasSubstr("owned by uid 65534"));
  ExpectAlive();
  client_.reset();
  EXPECT_EQ(server_->Stop(SIGTERM), 0);

  // The same object, with its owner allowed.
  ASSERT_NO_FATAL_FAILURE(StartServer({"--shm_allowed_uids=65534"}));
  EXPECT_TRUE(client_->RegisterShm("foreign", **shm).ok());
}

// A finite value that a penalty or the temperature pushes out of float32 fails its request
// (it came back OK with token -1, -inf or NaN); the same value masked out is harmless.
TEST_F(Hostile, ValuesLeavingFloat32FailTheirRequestOnly) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  constexpr int kVocab = 8;
  v1::SampleRequest step;
  v1::Tensor* t = step.mutable_logits();
  t->set_rows(6);
  t->set_cols(kVocab);
  const float big[6] = {1.0f, 10.0f, 1e34f, 3e38f, -3e38f, 3e38f};
  for (int r = 0; r < 6; ++r) {
    for (int c = 0; c < kVocab; ++c) t->mutable_values()->add_values(c == 0 ? big[r] : 0.5f * c);
  }
  v1::SamplerInputs* in = step.mutable_inputs();
  in->set_kind(v1::PREFILL);
  in->set_vocab_size(kVocab);
  for (int r = 0; r < 6; ++r) {
    v1::RequestInputs* req = in->add_requests();
    req->set_request_id("o" + std::to_string(r));
    req->set_row(r);
    req->mutable_params()->set_seq_seed(r);
    req->mutable_params()->set_top_logprobs(3);
  }
  in->mutable_requests(1)->mutable_params()->set_repetition_penalty(1e-38f);
  in->mutable_requests(1)->add_prompt_token_ids(0);       // 10 / 1e-38 = +inf
  in->mutable_requests(2)->mutable_params()->set_temperature(0.0f);  // 1e34 / 1e-5
  in->mutable_requests(3)->mutable_params()->set_temperature(0.5f);  // 3e38 / 0.5
  in->mutable_requests(4)->mutable_params()->set_temperature(0.5f);  // -3e38 / 0.5
  in->mutable_requests(5)->mutable_params()->set_temperature(0.5f);
  in->mutable_requests(5)->add_allowed_token_masks(std::string("\xFE\xFF\xFF\xFF", 4));
  auto reply = client_->Sample(step);
  ASSERT_TRUE(reply.ok()) << reply.status();
  for (int r : {1, 2, 3, 4}) {
    const auto& result = reply->results(r);
    EXPECT_EQ(result.status().code(), 3) << "request " << r;
    EXPECT_THAT(result.status().message(), HasSubstr("out of the float32 range")) << r;
    EXPECT_EQ(result.token_ids_size(), 0);
  }
  for (int r : {0, 5}) {
    const auto& result = reply->results(r);
    ASSERT_EQ(result.status().code(), 0) << result.status().message();
    ASSERT_EQ(result.token_ids_size(), 1);
    EXPECT_GE(result.token_ids(0), r == 5 ? 1 : 0);
    EXPECT_TRUE(std::isfinite(result.logprobs(0)));
    for (float lp : result.top_logprobs(0).logprobs()) EXPECT_FALSE(std::isnan(lp));
  }

  // DRAFT and DECODE rows too.
  v1::SampleRequest draft = step;
  draft.mutable_inputs()->set_kind(v1::DRAFT);
  draft.mutable_inputs()->clear_requests();
  v1::RequestInputs* d = draft.mutable_inputs()->add_requests();
  d->set_request_id("draft");
  d->add_rows(3);
  d->add_draft_indices(1);
  d->mutable_params()->set_temperature(0.5f);
  reply = client_->Sample(draft);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_THAT(reply->results(0).status().message(), HasSubstr("out of the float32 range"));

  v1::SampleRequest decode = step;
  decode.mutable_inputs()->set_kind(v1::DECODE);
  decode.mutable_inputs()->clear_requests();
  v1::RequestInputs* v = decode.mutable_inputs()->add_requests();
  v->set_request_id("decode");
  v->set_first_row(0);
  v->set_num_rows(4);  // reads row 3 whatever row 0's verification decides
  for (int i = 0; i < 3; ++i) v->add_draft_token_ids(7);
  v1::Tensor* q = v->mutable_draft_logprobs();
  q->set_rows(3);
  q->set_cols(kVocab);
  for (int i = 0; i < 3 * kVocab; ++i) q->mutable_values()->add_values(-2.0794415f);
  v->mutable_params()->set_temperature(0.5f);
  reply = client_->Sample(decode);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_THAT(reply->results(0).status().message(), HasSubstr("out of the float32 range"));
  ExpectAlive();
}

// Shards over one registered region whose columns are within the limit but whose
// concatenation is not within the request memory budget: refused once the budget is spent,
// before the server allocates the rest (it allocated 1 GiB before refusing).
TEST_F(Hostile, ShardsCannotExhaustServerMemory) {
  ASSERT_NO_FATAL_FAILURE(
      StartServer({"--max_request_memory_bytes=" + std::to_string(32 << 20)}));
  constexpr int kCols = 1 << 18;  // 16 shards: 2^22 columns, the default --max_vocab_size
  constexpr int kRows = 8;        // 8 MiB a shard; 128 MiB concatenated
  auto shm = ShmBuffer::Create(ShmName("shards"), int64_t{kRows} * kCols * 4);
  ASSERT_TRUE(shm.ok());
  ASSERT_TRUE(client_->RegisterShm("shards", **shm).ok());
  const int64_t rss_before = server_->RssKib("VmHWM:");
  v1::SampleRequest request;
  for (int s = 0; s < 16; ++s) {
    v1::Tensor* shard = request.mutable_logits()->add_shards();
    shard->set_dtype(v1::FLOAT32);
    shard->set_rows(kRows);
    shard->set_cols(kCols);
    shard->mutable_buffer()->set_name("shards");
  }
  request.mutable_inputs()->set_kind(v1::PREFILL);
  request.mutable_inputs()->set_vocab_size(kCols);
  request.mutable_inputs()->add_requests()->set_row(0);
  EXPECT_LT(request.ByteSizeLong(), 40000u);
  auto reply = client_->Sample(request);
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(reply.status().message()), HasSubstr("logits.shards"));
  EXPECT_THAT(std::string(reply.status().message()), HasSubstr("--max_request_memory_bytes"));
  const int64_t growth_kib = server_->RssKib("VmHWM:") - rss_before;
  // Twice the budget; ThreadSanitizer's shadow memory multiplies what a byte costs.
  const int64_t scale = UnderThreadSanitizer() ? 8 : 1;
  EXPECT_LT(growth_kib, scale * 64 * 1024) << "peak RSS grew by " << growth_kib << " KiB";
  ExpectAlive();
}

// Issue 45 item 3: a row built ~20 bytes per context token and sorted them, outside any budget
// (a 64M-token prompt with a repetition penalty: 10.4 s and 2.59 GB peak). The history's
// memory is reserved from --max_request_memory_bytes: a prompt that does not fit fails its
// request alone, naming the field, before anything is built; the step's other request is
// answered.
TEST_F(Hostile, ContextHistoryMemoryIsCountedInTheRequestBudget) {
  ASSERT_NO_FATAL_FAILURE(
      StartServer({"--max_request_memory_bytes=" + std::to_string(8 << 20)}));
  v1::SampleRequest step = SmallStep(11, 2, 64);
  v1::RequestInputs* heavy = step.mutable_inputs()->mutable_requests(0);
  // 4M tokens: 16 MB of sorted ids now (160 MB of entries and their sort before), over the
  // 8 MiB budget.
  constexpr int kPrompt = 4 << 20;
  heavy->mutable_prompt_token_ids()->Reserve(kPrompt);
  for (int i = 0; i < kPrompt; ++i) heavy->add_prompt_token_ids(i % 64);
  heavy->mutable_params()->set_repetition_penalty(1.1f);
  const int64_t rss_before = server_->RssKib("VmHWM:");
  auto reply = client_->Sample(step);
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_EQ(reply->results_size(), 2);
  EXPECT_EQ(reply->results(0).status().code(),
            static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(reply->results(0).status().message(), HasSubstr("requests[0].prompt_token_ids"));
  EXPECT_THAT(reply->results(0).status().message(), HasSubstr("--max_request_memory_bytes"));
  EXPECT_EQ(reply->results(1).status().code(), 0);
  EXPECT_EQ(reply->results(1).token_ids_size(), 1);
  // The message itself (16 MB parsed, twice over the wire) is all the step cost.
  const int64_t growth_kib = server_->RssKib("VmHWM:") - rss_before;
  const int64_t scale = UnderThreadSanitizer() ? 8 : 1;
  EXPECT_LT(growth_kib, scale * 96 * 1024) << "peak RSS grew by " << growth_kib << " KiB";
  ExpectAlive();
}

// Issue 45 item 4: every DECODE row rebuilt its context's history inside the backend's one
// step slot, so while one client's heavy step ran (1M-token context, q = 128, DRY: 4.4 s), a
// light step of another client that takes 0.13 ms alone waited 4.1 s. The history is built on
// the heavy step's own thread now, before the backend: the light step is answered while the
// heavy one is still being prepared.
TEST_F(Hostile, AHeavyStepDoesNotStallOtherClients) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  // ThreadSanitizer runs the DRY scan some 50 times slower: a shorter context is still heavy.
  constexpr int kRows = 32, kVocab = 64;
  const int kContext = UnderThreadSanitizer() ? 1 << 15 : 1 << 19;
  v1::SampleRequest heavy = SmallStep(12, kRows, kVocab);
  v1::SamplerInputs* in = heavy.mutable_inputs();
  in->set_kind(v1::DECODE);
  in->clear_requests();
  v1::RequestInputs* r = in->add_requests();
  r->set_request_id("heavy");
  r->set_first_row(0);
  r->set_num_rows(kRows);
  for (int j = 0; j + 1 < kRows; ++j) r->add_draft_token_ids(5);
  SetUniformDrafts(r, kRows, kVocab);
  // A context of one repeated token: DRY compares every position with the context's end.
  r->mutable_prompt_token_ids()->Reserve(kContext);
  for (int i = 0; i < kContext; ++i) r->add_prompt_token_ids(5);
  r->mutable_params()->set_seq_seed(1);
  r->mutable_params()->set_dry_multiplier(0.8f);
  r->mutable_params()->set_repetition_penalty(1.1f);
  auto other = Connect();
  std::atomic<bool> heavy_done{false};  // set once the heavy step is answered
  std::chrono::steady_clock::time_point heavy_end, light_end;
  const auto start = std::chrono::steady_clock::now();
  ClientOptions patient;
  patient.timeout = std::chrono::milliseconds(120000);
  auto heavy_client = SamplerClient::Connect(server_->target(), patient);
  ASSERT_TRUE(heavy_client.ok());
  std::thread heavy_thread([&] {
    auto reply = (*heavy_client)->Sample(heavy);
    heavy_end = std::chrono::steady_clock::now();
    heavy_done.store(true);
    ASSERT_TRUE(reply.ok()) << reply.status();
    ASSERT_EQ(reply->results_size(), 1);
    EXPECT_EQ(reply->results(0).status().code(), 0) << reply->results(0).status().message();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const bool heavy_still_running = !heavy_done.load();
  const auto light_sent = std::chrono::steady_clock::now();
  auto light = other->Sample(SmallStep(13));
  light_end = std::chrono::steady_clock::now();
  heavy_thread.join();
  ASSERT_TRUE(light.ok()) << light.status();
  auto ms = [&](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::milli>(t - start).count();
  };
  std::printf("heavy step (DECODE q = %d, %d-token context, DRY) answered at %.0f ms; the other "
              "client's light step, sent at 200 ms, at %.0f ms\n",
              kRows, kContext, ms(heavy_end), ms(light_end));
  // The test means something only if the heavy step outlasts the light one's sending.
  ASSERT_TRUE(heavy_still_running) << "the heavy step took under 200 ms: make it heavier";
  // Waiting for the heavy step would cost the light one all of the heavy step's remaining
  // time; it gets under half of it (in the figures above, 2 ms of 500: before, 482 of 484).
  EXPECT_LT((light_end - light_sent) * 2, heavy_end - light_sent)
      << "the light step waited for the heavy one";
  ExpectAlive();
}

// Issue 25's request: 16 shards of [1, 2^24] over one registered 64 MiB region, under the
// default budget (2 GiB), which the concatenation (1 GiB) fits. The columns' limit is checked
// on the shape the request declares, before any shard is resolved or a byte reserved: refused
// in milliseconds, where it cost 1.1 GB of peak RSS and 4.3 s before.
TEST_F(Hostile, ShardedColumnsOverTheLimitAreRefusedBeforeAnyCopy) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  constexpr int kCols = 1 << 24;
  auto shm = ShmBuffer::Create(ShmName("wide-shards"), int64_t{kCols} * 4);
  ASSERT_TRUE(shm.ok()) << shm.status();
  ASSERT_TRUE(client_->RegisterShm("wide-shards", **shm).ok());
  v1::SampleRequest request;
  for (int s = 0; s < 16; ++s) {
    v1::Tensor* shard = request.mutable_logits()->add_shards();
    shard->set_dtype(v1::FLOAT32);
    shard->set_rows(1);
    shard->set_cols(kCols);
    shard->mutable_buffer()->set_name("wide-shards");
  }
  request.mutable_inputs()->set_kind(v1::PREFILL);
  request.mutable_inputs()->set_vocab_size(1000);
  request.mutable_inputs()->add_requests()->set_row(0);
  EXPECT_LT(request.ByteSizeLong(), 1000u);
  const int64_t rss_before = server_->RssKib("VmHWM:");
  const auto start = std::chrono::steady_clock::now();
  auto reply = client_->Sample(request);
  const double ms = std::chrono::duration<double, std::milli>(
                        std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(reply.status().message()),
              HasSubstr("logits.cols: 268435456 (the shards' columns added up) exceeds the "
                        "server limit of 4194304"));
  const int64_t growth_kib = server_->RssKib("VmHWM:") - rss_before;
  const int64_t scale = UnderThreadSanitizer() ? 8 : 1;
  EXPECT_LT(growth_kib, scale * 64 * 1024) << "peak RSS grew by " << growth_kib << " KiB";
  // Milliseconds, not the seconds a 1 GiB copy takes; loose for sanitizers and a loaded CI box.
  EXPECT_LT(ms, 1000.0) << "refused after " << ms << " ms";
  std::printf("16 shards of [1, 2^24]: refused in %.1f ms, peak RSS +%lld KiB\n", ms,
              static_cast<long long>(growth_kib));
  ExpectAlive();
}

// The pool is accounted in bytes with its bookkeeping: 1-value rows cannot overrun it.
TEST_F(Hostile, DraftPoolBytesBoundTinyRows) {
  constexpr int kPoolBytes = 64 << 10;
  ASSERT_NO_FATAL_FAILURE(StartServer({"--draft_pool_bytes=" + std::to_string(kPoolBytes)}));
  int stored = 0, refused = 0;
  for (int i = 0; i < 1000; ++i) {
    v1::SampleRequest draft;
    draft.mutable_logits()->set_rows(1);
    draft.mutable_logits()->set_cols(1);
    draft.mutable_logits()->mutable_values()->add_values(0.0f);
    draft.mutable_inputs()->set_kind(v1::DRAFT);
    draft.mutable_inputs()->set_vocab_size(1);
    v1::RequestInputs* d = draft.mutable_inputs()->add_requests();
    d->set_request_id("tiny" + std::to_string(i));
    d->add_rows(0);
    d->add_draft_indices(1);
    auto reply = client_->Sample(draft);
    ASSERT_TRUE(reply.ok()) << reply.status();
    if (reply->results(0).status().code() == 0) {
      ++stored;
    } else {
      EXPECT_EQ(reply->results(0).status().code(), 8);  // RESOURCE_EXHAUSTED
      ++refused;
    }
  }
  // A row of 1 value costs 4 + 128 bytes, its entry 128 plus its key.
  EXPECT_LE(stored, kPoolBytes / (4 + 128 + 128));
  EXPECT_GT(stored, kPoolBytes / (4 + 128 + 128 + 64));
  EXPECT_EQ(stored + refused, 1000);
  ExpectAlive();
}

v1::SampleRequest DraftStep(const std::string& id) {
  v1::SampleRequest draft = SmallStep(5, 2, 64);
  draft.mutable_inputs()->set_kind(v1::DRAFT);
  draft.mutable_inputs()->clear_requests();
  v1::RequestInputs* d = draft.mutable_inputs()->add_requests();
  d->set_request_id(id);
  d->add_rows(0);
  d->add_rows(1);
  d->add_draft_indices(1);
  d->add_draft_indices(2);
  d->mutable_params()->set_seq_seed(11);
  return draft;
}

v1::SampleRequest DecodeStep(const std::string& id, const v1::RequestResult& drafted) {
  v1::SampleRequest decode = SmallStep(6, 3, 64, 2);
  decode.mutable_inputs()->set_kind(v1::DECODE);
  decode.mutable_inputs()->clear_requests();
  v1::RequestInputs* r = decode.mutable_inputs()->add_requests();
  r->set_request_id(id);
  r->set_first_row(0);
  r->set_num_rows(3);
  *r->mutable_draft_token_ids() = drafted.token_ids();
  r->mutable_params()->set_seq_seed(11);
  return decode;
}

// Client B's DECODE with client A's request id neither sees nor consumes A's drafts (it did).
TEST_F(Hostile, DraftPoolEntriesAreScopedByClient) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  auto a = Connect();
  auto b = Connect();
  auto drafted = a->Sample(DraftStep("x"));
  ASSERT_TRUE(drafted.ok());
  ASSERT_EQ(drafted->results(0).status().code(), 0);
  auto stolen = b->Sample(DecodeStep("x", drafted->results(0)));
  ASSERT_TRUE(stolen.ok());
  EXPECT_EQ(stolen->results(0).status().code(), 9);  // FAILED_PRECONDITION
  auto own = a->Sample(DecodeStep("x", drafted->results(0)));
  ASSERT_TRUE(own.ok());
  EXPECT_EQ(own->results(0).status().code(), 0) << own->results(0).status().message();

  // Release is scoped the same way.
  ASSERT_TRUE(a->Sample(DraftStep("y")).ok());
  auto released_by_b = b->Release({"y"});
  ASSERT_TRUE(released_by_b.ok()) << released_by_b.status();
  EXPECT_EQ(*released_by_b, 0);
  auto released_by_a = a->Release({"y"});
  ASSERT_TRUE(released_by_a.ok()) << released_by_a.status();
  EXPECT_EQ(*released_by_a, 2);
  EXPECT_EQ(*a->Release({"y"}), 0);
  ExpectAlive();
}

// Drafts whose DECODE never comes expire (a crashed worker filled the pool for good).
TEST_F(Hostile, DraftPoolEntriesExpire) {
  ASSERT_NO_FATAL_FAILURE(StartServer({"--draft_pool_ttl_ms=300"}));
  auto drafted = client_->Sample(DraftStep("late"));
  ASSERT_TRUE(drafted.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  auto late = client_->Sample(DecodeStep("late", drafted->results(0)));
  ASSERT_TRUE(late.ok());
  EXPECT_EQ(late->results(0).status().code(), 9);
  EXPECT_THAT(late->results(0).status().message(), HasSubstr("expired"));
  ExpectAlive();
}

// On a stream, a step the server cannot take is answered with its error and the stream goes
// on; a message over --max_message_bytes ends only that stream (gRPC will not receive it),
// with RESOURCE_EXHAUSTED, and other streams go on.
TEST_F(Hostile, StreamsSurviveBadStepsAndOversizedMessagesEndOnlyTheirStream) {
  ASSERT_NO_FATAL_FAILURE(StartServer({"--max_message_bytes=1048576"}));
  auto other = client_->OpenStream();
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE((*other)->Step(SmallStep(1)).ok());

  auto stream = client_->OpenStream();
  ASSERT_TRUE(stream.ok());
  v1::SampleRequest bad;
  SetWrappingTensor(bad.mutable_logits());
  bad.set_step_id(2);
  bad.mutable_inputs()->set_kind(v1::PREFILL);
  bad.mutable_inputs()->set_vocab_size(1);
  bad.mutable_inputs()->add_requests()->set_row(1);
  auto answered = (*stream)->Step(bad);
  ASSERT_TRUE(answered.ok()) << answered.status();
  EXPECT_EQ(answered->error().code(), 3);
  EXPECT_THAT(answered->error().message(), HasSubstr("logits.row_stride"));
  auto next = (*stream)->Step(SmallStep(3));
  ASSERT_TRUE(next.ok());
  EXPECT_FALSE(next->has_error());

  v1::SampleRequest big = SmallStep(4, 1, 64);
  big.mutable_logits()->set_cols(300000);
  big.mutable_logits()->mutable_values()->mutable_values()->Resize(300000, 0.5f);
  auto refused = (*stream)->Step(big);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();

  auto still = (*other)->Step(SmallStep(5));
  ASSERT_TRUE(still.ok()) << still.status();
  EXPECT_EQ(still->results_size(), 3);
  EXPECT_TRUE((*other)->Close().ok());
  ExpectAlive();
}

}  // namespace
}  // namespace samplerd

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 2) {
    std::fprintf(stderr, "usage: hostile_client_test SAMPLERD\n");
    return 2;
  }
  samplerd::g_samplerd = argv[1];
  return RUN_ALL_TESTS();
}
