#include "pipeline/proto_convert.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "google/protobuf/util/message_differencer.h"
#include "sampler/cpu_backend.h"
#include "sampler/dtype.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

v1::SampleRequest Step(int rows, int cols, const std::vector<float>& logits) {
  v1::SampleRequest request;
  request.set_step_id(4);
  v1::Tensor* t = request.mutable_logits();
  t->set_rows(rows);
  t->set_cols(cols);
  for (float v : logits) t->mutable_values()->add_values(v);
  v1::SamplerInputs* in = request.mutable_inputs();
  in->set_kind(v1::PREFILL);
  in->set_vocab_size(cols);
  for (int r = 0; r < rows; ++r) {
    v1::RequestInputs* req = in->add_requests();
    req->set_request_id("r" + std::to_string(r));
    req->set_row(r);
    req->mutable_params()->set_seq_seed(10 + r);
    req->mutable_params()->set_top_logprobs(3);
  }
  return request;
}

v1::SampleResponse Sample(const v1::SampleRequest& request) {
  auto converted = StepFromProto(request, nullptr);
  EXPECT_TRUE(converted.ok()) << converted.status();
  auto plan = PlanConvertedStep(**converted, Limits{}, [] { return uint64_t{0}; });
  EXPECT_TRUE(plan.ok()) << plan.status();
  auto backend = CpuBackend::Create({.num_threads = 1});
  auto result = (*backend)->Sample(*plan);
  EXPECT_TRUE(result.ok());
  v1::SampleResponse response;
  ResultToProto(*result, &response);
  return response;
}

std::vector<float> Logits(int n) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = static_cast<float>((i * 37) % 23) * 0.3f - 2.0f;
  return v;
}

TEST(ProtoConvert, ShardsConcatenateAlongColumns) {
  const int rows = 3, cols = 10, split = 4;
  const std::vector<float> logits = Logits(rows * cols);
  const v1::SampleResponse whole = Sample(Step(rows, cols, logits));
  v1::SampleRequest sharded = Step(rows, cols, logits);
  v1::Tensor* t = sharded.mutable_logits();
  t->clear_values();
  for (int s = 0; s < 2; ++s) {
    v1::Tensor* shard = t->add_shards();
    const int c0 = s == 0 ? 0 : split, c1 = s == 0 ? split : cols;
    shard->set_rows(rows);
    shard->set_cols(c1 - c0);
    for (int r = 0; r < rows; ++r) {
      for (int c = c0; c < c1; ++c) shard->mutable_values()->add_values(logits[r * cols + c]);
    }
  }
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(whole, Sample(sharded)));
}

TEST(ProtoConvert, DataBytesAndValuesAreTheSameTensor) {
  const int rows = 2, cols = 7;
  const std::vector<float> logits = Logits(rows * cols);
  v1::SampleRequest as_data = Step(rows, cols, logits);
  as_data.mutable_logits()->clear_values();
  as_data.mutable_logits()->set_dtype(v1::FLOAT32);
  as_data.mutable_logits()->set_data(logits.data(), logits.size() * sizeof(float));
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(Sample(Step(rows, cols, logits)),
                                                                 Sample(as_data)));
}

TEST(ProtoConvert, RowStrideSkipsPaddingColumns) {
  // A [2, 5] view with row_stride 8 over 16 values: columns 5..7 of each row are not read.
  std::vector<float> padded(16, 1e30f);
  const std::vector<float> logits = Logits(10);
  for (int r = 0; r < 2; ++r) {
    for (int c = 0; c < 5; ++c) padded[r * 8 + c] = logits[r * 5 + c];
  }
  v1::SampleRequest strided = Step(2, 5, padded);
  strided.mutable_logits()->set_row_stride(8);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(Sample(Step(2, 5, logits)),
                                                                 Sample(strided)));
}

TEST(ProtoConvert, MalformedTensorsNameTheField) {
  auto error = [](const v1::SampleRequest& r) {
    auto c = StepFromProto(r, nullptr);
    return c.ok() ? std::string("ok") : std::string(c.status().message());
  };
  v1::SampleRequest r = Step(2, 4, Logits(8));
  r.mutable_logits()->set_row_stride(3);
  EXPECT_THAT(error(r), HasSubstr("logits.row_stride"));
  r = Step(2, 4, Logits(7));
  EXPECT_THAT(error(r), HasSubstr("logits.values: 7 values"));
  r = Step(2, 4, Logits(8));
  r.mutable_logits()->clear_values();
  r.mutable_logits()->set_data(std::string(30, '\0'));
  EXPECT_THAT(error(r), HasSubstr("logits.dtype: required"));
  r.mutable_logits()->set_dtype(v1::BFLOAT16);
  EXPECT_EQ(error(r), "ok");  // [2, 4] bf16 needs 16 of the 30 bytes
  r.mutable_logits()->set_data(std::string(10, '\0'));
  EXPECT_THAT(error(r), HasSubstr("logits.data: 10 bytes"));
  r = Step(2, 4, Logits(8));
  r.mutable_logits()->mutable_buffer()->set_name("x");
  EXPECT_THAT(error(r), HasSubstr("logits.dtype: required"));  // checked before the source
  r.mutable_logits()->set_dtype(v1::FLOAT32);
  auto c = StepFromProto(r, nullptr);  // no registry in run-local
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("need a running samplerd"));
  r = Step(2, 4, Logits(8));
  r.mutable_inputs()->mutable_requests(0)->mutable_draft_logprobs()->set_rows(1);
  r.mutable_inputs()->mutable_requests(0)->mutable_draft_topn()->mutable_values()->set_rows(1);
  auto both = StepFromProto(r, nullptr);
  ASSERT_TRUE(both.ok());
  EXPECT_THAT(std::string((*both)->request_faults[0].message()), HasSubstr("not both"));
  EXPECT_TRUE((*both)->request_faults[1].ok());
}

// Every tensor's extent goes through one overflow-checked computation: a row_stride whose
// extent wraps around 2^64 to a few bytes is refused wherever a tensor appears.
TEST(ProtoConvert, WrappingExtentsAreRefusedEverywhere) {
  auto wrap = [](v1::Tensor* t) {
    t->Clear();
    t->set_dtype(v1::FLOAT32);
    t->set_rows(2);
    t->set_cols(1);
    t->set_row_stride(int64_t{1} << 62);  // ((2 - 1) * 2^62 + 1) * 4 = 2^64 + 4
    t->set_data(std::string(4, '\0'));
  };
  v1::SampleRequest r = Step(2, 4, Logits(8));
  wrap(r.mutable_logits());
  auto c = StepFromProto(r, nullptr);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("logits.row_stride"));

  r = Step(2, 4, Logits(8));
  r.mutable_logits()->clear_values();
  r.mutable_logits()->set_cols(0);  // the shards' sum
  wrap(r.mutable_logits()->add_shards());
  c = StepFromProto(r, nullptr);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("logits.shards[0].row_stride"));

  r = Step(2, 4, Logits(8));
  wrap(r.mutable_inputs()->mutable_requests(0)->mutable_draft_logprobs());
  wrap(r.mutable_inputs()->mutable_requests(1)->mutable_draft_topn()->mutable_values());
  c = StepFromProto(r, nullptr);
  ASSERT_TRUE(c.ok());
  EXPECT_THAT(std::string((*c)->request_faults[0].message()),
              HasSubstr("requests[0].draft_logprobs.row_stride"));
  EXPECT_THAT(std::string((*c)->request_faults[1].message()),
              HasSubstr("requests[1].draft_topn.values.row_stride"));
}

// Concatenated shards are reserved from the budget before they are allocated.
TEST(ProtoConvert, ShardsAreReservedFromTheBudget) {
  v1::SampleRequest r = Step(2, 8, {});
  r.mutable_logits()->clear_values();
  for (int s = 0; s < 2; ++s) {
    v1::Tensor* shard = r.mutable_logits()->add_shards();
    shard->set_rows(2);
    shard->set_cols(4);
    for (float v : Logits(8)) shard->mutable_values()->add_values(v);
  }
  MemoryBudget small(2 * 8 * 4 - 1);
  auto refused = StepFromProto(r, nullptr, &small);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("logits.shards"));
  EXPECT_EQ(small.used(), 0);
  MemoryBudget enough(2 * 8 * 4);
  {
    auto converted = StepFromProto(r, nullptr, &enough);
    ASSERT_TRUE(converted.ok());
    EXPECT_EQ(enough.used(), 2 * 8 * 4);  // held while the step lives
  }
  EXPECT_EQ(enough.used(), 0);
}

// A resolver whose output regions are host bytes (the conversion's checks, not the writes).
class OutputResolver final : public LogitsSourceResolver {
 public:
  absl::StatusOr<const void*> Resolve(const v1::Tensor&, int64_t, const std::string& field,
                                      bool*, std::shared_ptr<const void>*,
                                      std::function<absl::Status()>*) override {
    return absl::UnimplementedError(field);
  }
  absl::StatusOr<const void*> ResolveReadyEvent(const std::string&, const std::string& field,
                                                std::shared_ptr<const void>*) override {
    return absl::UnimplementedError(field);
  }
  absl::StatusOr<void*> ResolveOutput(const v1::BufferSlice& slice, int64_t byte_extent,
                                      const std::string& field,
                                      std::shared_ptr<const void>*) override {
    extents.emplace_back(field, byte_extent);
    return bytes.data() + slice.byte_offset();
  }
  std::vector<std::pair<std::string, int64_t>> extents;
  std::vector<char> bytes = std::vector<char>(4096);
};

// A resolver whose registered buffers are device memory (here, addresses nothing reads) and
// whose ready events are opaque pointers; a buffer named "gone" is unknown.
class DeviceResolver final : public LogitsSourceResolver {
 public:
  absl::StatusOr<const void*> Resolve(const v1::Tensor& tensor, int64_t byte_extent,
                                      const std::string& field, bool* on_device,
                                      std::shared_ptr<const void>*,
                                      std::function<absl::Status()>*) override {
    if (tensor.buffer().name() == "gone") return absl::NotFoundError(field + ": no such buffer");
    *on_device = true;
    extents.emplace_back(field, byte_extent);
    return reinterpret_cast<const void*>(uintptr_t{0x1000} + tensor.buffer().byte_offset());
  }
  absl::StatusOr<const void*> ResolveReadyEvent(const std::string& handle, const std::string&,
                                                std::shared_ptr<const void>*) override {
    return reinterpret_cast<const void*>(uintptr_t{0x2000} + handle.size());
  }
  std::vector<std::pair<std::string, int64_t>> extents;
};

// Issue 47: draft tensors by handle become device views of the requested bytes, each with its
// own ready event, in their own dtype and row stride; one that cannot be resolved fails its
// request alone, naming its field.
TEST(ProtoConvert, DeviceDraftTensorsAreViewsAndFailAlone) {
  v1::SampleRequest r = Step(4, 8, Logits(32));
  v1::SamplerInputs* in = r.mutable_inputs();
  in->set_kind(v1::DECODE);
  in->clear_requests();
  for (int i = 0; i < 2; ++i) {
    v1::RequestInputs* req = in->add_requests();
    req->set_request_id("d" + std::to_string(i));
    req->set_first_row(2 * i);
    req->set_num_rows(2);
    req->add_draft_token_ids(3);
    v1::Tensor* q = req->mutable_draft_logprobs();
    q->set_dtype(v1::BFLOAT16);
    q->set_rows(1);
    q->set_cols(8);
    q->set_row_stride(16);
    q->mutable_buffer()->set_name(i == 0 ? "drafts" : "gone");
    q->mutable_buffer()->set_byte_offset(64);
    q->set_ready_event(std::string(64, 'e'));
  }
  DeviceResolver resolver;
  auto converted = StepFromProto(r, &resolver);
  ASSERT_TRUE(converted.ok()) << converted.status();
  const ConvertedStep& step = **converted;
  ASSERT_EQ(step.request_faults.size(), 2u);
  EXPECT_TRUE(step.request_faults[0].ok()) << step.request_faults[0];
  EXPECT_EQ(step.request_faults[1].code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(step.request_faults[1].message()),
              HasSubstr("requests[1].draft_logprobs"));
  const LogitsView& q = step.step.requests[0].drafts.values;
  EXPECT_TRUE(q.on_device);
  EXPECT_EQ(q.dtype, DType::kBFloat16);
  EXPECT_EQ(q.row_stride, 16);
  EXPECT_EQ(q.data, reinterpret_cast<const void*>(uintptr_t{0x1000 + 64}));
  EXPECT_EQ(q.ready_event, reinterpret_cast<const void*>(uintptr_t{0x2000 + 64}));
  ASSERT_EQ(resolver.extents.size(), 1u);
  EXPECT_EQ(resolver.extents[0].first, "requests[0].draft_logprobs");
  EXPECT_EQ(resolver.extents[0].second, 8 * 2);  // one row of 8 bf16: the stride never read
}

// Issue 47: tensor-parallel shards in device memory are one view whose columns stay in each
// shard (nothing gathered or reserved), each shard with its own stride and ready event.
v1::SampleRequest DeviceShardStep(const std::vector<int>& cols, const std::vector<int64_t>& offsets) {
  v1::SampleRequest r = Step(2, 8, Logits(16));
  v1::Tensor* t = r.mutable_logits();
  t->clear_values();
  t->set_cols(0);
  for (size_t s = 0; s < cols.size(); ++s) {
    v1::Tensor* shard = t->add_shards();
    shard->set_dtype(v1::BFLOAT16);
    shard->set_rows(2);
    shard->set_cols(cols[s]);
    shard->set_row_stride(cols[s] + 3);
    shard->mutable_buffer()->set_name("rank" + std::to_string(s));
    shard->mutable_buffer()->set_byte_offset(offsets[s]);
    shard->set_ready_event(std::string(64 + s, 'e'));
  }
  return r;
}

TEST(ProtoConvert, DeviceShardsAreOneViewReadInPlace) {
  DeviceResolver resolver;
  MemoryBudget budget(0);  // nothing may be reserved: no gather copy
  auto converted = StepFromProto(DeviceShardStep({3, 5}, {0, 1000}), &resolver, &budget);
  ASSERT_TRUE(converted.ok()) << converted.status();
  const LogitsView& v = (*converted)->step.logits;
  EXPECT_TRUE(v.on_device);
  EXPECT_EQ(v.cols, 8);
  EXPECT_EQ(v.row_stride, 8);
  EXPECT_EQ(v.dtype, DType::kBFloat16);
  EXPECT_EQ(v.ready_event, nullptr);
  ASSERT_EQ(v.shards.size(), 2u);
  EXPECT_EQ(v.data, v.shards[0].data);
  for (int s = 0; s < 2; ++s) {
    const LogitsShard& shard = v.shards[s];
    EXPECT_EQ(shard.data, reinterpret_cast<const void*>(uintptr_t{0x1000} + (s == 0 ? 0 : 1000)));
    EXPECT_EQ(shard.col_begin, s == 0 ? 0 : 3);
    EXPECT_EQ(shard.cols, s == 0 ? 3 : 5);
    EXPECT_EQ(shard.row_stride, shard.cols + 3);
    EXPECT_EQ(shard.ready_event, reinterpret_cast<const void*>(uintptr_t{0x2000} + 64 + s));
  }
  // Each shard's extent is checked against its source: (rows - 1) * stride + cols elements.
  ASSERT_EQ(resolver.extents.size(), 2u);
  EXPECT_EQ(resolver.extents[0].second, (6 + 3) * 2);
  EXPECT_EQ(resolver.extents[1].second, (8 + 5) * 2);
  // The CPU backend reads no device memory.
  auto plan = PlanConvertedStep(**converted, Limits{}, [] { return uint64_t{0}; });
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto cpu = CpuBackend::Create({.num_threads = 1});
  auto result = (*cpu)->Sample(*plan);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("CUDA backend"));
}

// What a careless or hostile tensor-parallel worker can send: each fails the step naming the
// field, before anything is read.
TEST(ProtoConvert, DeviceShardsThatCannotBeOneTensorAreRefused) {
  DeviceResolver resolver;
  auto refused = [&](const v1::SampleRequest& r, absl::StatusCode code, const std::string& field,
                     const std::string& why) {
    auto converted = StepFromProto(r, &resolver);
    ASSERT_FALSE(converted.ok());
    EXPECT_EQ(converted.status().code(), code) << converted.status();
    EXPECT_THAT(std::string(converted.status().message()), HasSubstr(field));
    EXPECT_THAT(std::string(converted.status().message()), HasSubstr(why));
  };
  // Overlapping slices: shard 1 starts inside shard 0's bytes ((2 - 1) * 7 + 4 = 11 elements).
  refused(DeviceShardStep({4, 4}, {0, 20}), absl::StatusCode::kInvalidArgument, "logits.shards[1]",
          "overlap");
  refused(DeviceShardStep({4, 4}, {20, 0}), absl::StatusCode::kInvalidArgument, "logits.shards[1]",
          "logits.shards[0]");
  // Columns that do not add up to what the tensor declares.
  v1::SampleRequest sum = DeviceShardStep({3, 5}, {0, 1000});
  sum.mutable_logits()->set_cols(9);
  refused(sum, absl::StatusCode::kInvalidArgument, "logits.cols", "added up (8)");
  // One shard on the host, one on the device.
  v1::SampleRequest mixed = DeviceShardStep({3, 5}, {0, 1000});
  mixed.mutable_logits()->mutable_shards(0)->clear_buffer();
  mixed.mutable_logits()->mutable_shards(0)->set_data(std::string(30, '\0'));
  refused(mixed, absl::StatusCode::kInvalidArgument, "logits.shards[1]", "same kind of memory");
  // Another dtype, other rows.
  v1::SampleRequest dtype = DeviceShardStep({3, 5}, {0, 1000});
  dtype.mutable_logits()->mutable_shards(1)->set_dtype(v1::FLOAT16);
  refused(dtype, absl::StatusCode::kInvalidArgument, "logits.shards[1]", "same rows and dtype");
  // More shards than the kernels look up.
  std::vector<int> cols(kMaxDeviceShards + 1, 1);
  std::vector<int64_t> offsets;
  for (size_t s = 0; s < cols.size(); ++s) offsets.push_back(static_cast<int64_t>(s) * 64);
  v1::SampleRequest many = DeviceShardStep(cols, offsets);
  many.mutable_inputs()->set_vocab_size(static_cast<int>(cols.size()));
  refused(many, absl::StatusCode::kInvalidArgument, "logits.shards",
          "more than " + std::to_string(kMaxDeviceShards));
  // A shard that cannot be resolved names itself.
  v1::SampleRequest gone = DeviceShardStep({3, 5}, {0, 1000});
  gone.mutable_logits()->mutable_shards(1)->mutable_buffer()->set_name("gone");
  refused(gone, absl::StatusCode::kNotFound, "logits.shards[1]", "no such buffer");
}

TEST(ProtoConvert, ABatchIsItsRequests) {
  v1::SampleRequest request = Step(3, 8, Logits(24));
  v1::SampleRequest batched = request;
  batched.mutable_inputs()->clear_requests();
  v1::RequestBatch* batch = batched.mutable_inputs()->mutable_batch();
  batch->mutable_params()->set_top_logprobs(3);
  const int32_t rows[] = {0, 1, 2};
  const uint64_t seeds[] = {10, 11, 12};
  batch->set_rows(std::string(reinterpret_cast<const char*>(rows), sizeof(rows)));
  batch->set_seq_seeds(std::string(reinterpret_cast<const char*>(seeds), sizeof(seeds)));
  batch->set_request_id_prefix("r");
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(Sample(request),
                                                                 Sample(batched)));
}

TEST(ProtoConvert, PackedResultsHoldTheResults) {
  const v1::SampleRequest request = Step(3, 8, Logits(24));
  const v1::SampleResponse plain = Sample(request);
  auto converted = StepFromProto(request, nullptr);
  ASSERT_TRUE(converted.ok());
  auto plan = PlanConvertedStep(**converted, Limits{}, [] { return uint64_t{0}; });
  auto backend = CpuBackend::Create({.num_threads = 1});
  auto result = (*backend)->Sample(*plan);
  ASSERT_TRUE(result.ok());
  v1::SampleResponse packed;
  ResultToProto(*result, &packed, /*packed=*/true);
  EXPECT_EQ(packed.results_size(), 0);
  const v1::PackedResults& p = packed.packed();
  ASSERT_EQ(p.top_logprobs(), 3);
  ASSERT_EQ(p.token_ids().size(), 3 * sizeof(int32_t));
  ASSERT_EQ(p.top_token_logprobs().size(), 9 * sizeof(float));
  for (int i = 0; i < 3; ++i) {
    int32_t token;
    float logprob;
    std::memcpy(&token, p.token_ids().data() + 4 * i, 4);
    std::memcpy(&logprob, p.logprobs().data() + 4 * i, 4);
    EXPECT_EQ(token, plain.results(i).token_ids(0));
    EXPECT_EQ(logprob, plain.results(i).logprobs(0));
    for (int k = 0; k < 3; ++k) {
      int32_t top;
      std::memcpy(&top, p.top_token_ids().data() + 4 * (3 * i + k), 4);
      EXPECT_EQ(top, plain.results(i).top_logprobs(0).token_ids(k));
    }
    EXPECT_EQ(p.request_ids(i), plain.results(i).request_id());
  }
}

TEST(ProtoConvert, OutputSlicesAreSizedByTheStep) {
  v1::SampleRequest request = Step(4, 8, Logits(32));
  request.mutable_inputs()->set_kind(v1::DECODE);
  for (int i = 0; i < 4; ++i) {
    v1::RequestInputs* r = request.mutable_inputs()->mutable_requests(i);
    r->set_first_row(i);
    r->set_num_rows(1);
  }
  request.mutable_inputs()->mutable_requests(3)->set_num_rows(1);
  v1::StepOutput* out = request.mutable_output();
  out->mutable_token_ids()->set_byte_offset(0);
  out->mutable_num_accepted()->set_byte_offset(64);
  out->mutable_done_word()->set_byte_offset(128);
  out->set_done_value(7);
  {
    OutputResolver resolver;
    auto converted = StepFromProto(request, &resolver);
    ASSERT_TRUE(converted.ok()) << converted.status();
    const StepOutputTarget& target = (*converted)->step.output;
    EXPECT_EQ(target.tokens_per_request, 1);
    EXPECT_EQ(target.done_value, 7u);
    EXPECT_EQ(target.token_ids, resolver.bytes.data());
    EXPECT_EQ(target.done_word, resolver.bytes.data() + 128);
    EXPECT_THAT(resolver.extents,
                ::testing::ElementsAre(std::make_pair(std::string("output.token_ids"), 16),
                                       std::make_pair(std::string("output.num_accepted"), 16),
                                       std::make_pair(std::string("output.done_word"), 4)));
  }
  // A request of q = 3 rows emits up to 3 tokens: a stride of 2 is refused, 3 sizes the area.
  request.mutable_inputs()->mutable_requests(2)->set_num_rows(3);
  out->set_tokens_per_request(2);
  {
    OutputResolver resolver;
    auto converted = StepFromProto(request, &resolver);
    ASSERT_FALSE(converted.ok());
    EXPECT_THAT(converted.status().message(),
                HasSubstr("output.tokens_per_request: 2 is fewer than the 3 tokens requests[2]"));
  }
  out->set_tokens_per_request(3);
  {
    OutputResolver resolver;
    ASSERT_TRUE(StepFromProto(request, &resolver).ok());
    EXPECT_EQ(resolver.extents[0].second, 4 * 3 * 4);
  }
  out->set_tokens_per_request(-1);
  {
    OutputResolver resolver;
    EXPECT_THAT(StepFromProto(request, &resolver).status().message(),
                HasSubstr("output.tokens_per_request: -1 is outside [0, "));
  }
  out->set_tokens_per_request(Limits{}.max_rows + 1);  // a 2D copy's pitch stays small
  {
    OutputResolver resolver;
    EXPECT_EQ(StepFromProto(request, &resolver).status().code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(resolver.extents.empty());
  }
  // Without a resolver (run-local) nothing can be written.
  out->set_tokens_per_request(3);
  EXPECT_EQ(StepFromProto(request, nullptr).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace samplerd
