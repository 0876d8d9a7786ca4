#include "server/group_registry.h"

#include <spdlog/spdlog.h>

#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "sampler/group_packet.h"

namespace samplerd {

// A group's state, shared by the registry and the steps holding it.
struct Group {
  std::string id;
  GroupConfig config;
  absl::Mutex mu;
  GroupState state ABSL_GUARDED_BY(mu) = GroupState::kJoining;
  std::string error ABSL_GUARDED_BY(mu);
  std::unique_ptr<GroupComm> comm ABSL_GUARDED_BY(mu);
  absl::Time join_deadline;
  // Turns: the step holding the group has ticket `serving`; BeginStep hands out `next_ticket`.
  uint64_t next_ticket ABSL_GUARDED_BY(mu) = 0;
  uint64_t serving ABSL_GUARDED_BY(mu) = 0;
  bool op_in_flight ABSL_GUARDED_BY(mu) = false;
  absl::Time op_deadline ABSL_GUARDED_BY(mu);
  int64_t steps ABSL_GUARDED_BY(mu) = 0;
  bool destroyed ABSL_GUARDED_BY(mu) = false;
  // Steps waiting for or holding a turn: while any does, the communicator and its buffers
  // (which a step may still be sampling from) stay allocated.
  int users ABSL_GUARDED_BY(mu) = 0;

  bool IdleLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return users == 0 && !op_in_flight; }
};

namespace {

absl::Status GroupUnavailable(const Group& group, const std::string& error) {
  return absl::UnavailableError(absl::StrCat("group '", group.id, "' failed: ", error));
}

std::string Millis(absl::Duration d) { return absl::StrCat(absl::ToInt64Milliseconds(d), " ms"); }

}  // namespace

const char* GroupStateName(GroupState state) {
  switch (state) {
    case GroupState::kJoining: return "JOINING";
    case GroupState::kReady: return "READY";
    case GroupState::kFailed: return "FAILED";
  }
  return "?";
}

GroupRegistry::GroupRegistry(GroupTransport* transport, const Options& options,
                             std::function<void(const std::string&, const std::string&)> on_failure)
    : transport_(transport), options_(options), on_failure_(std::move(on_failure)) {
  if (transport_ != nullptr) watchdog_ = std::thread([this] { Watchdog(); });
}

GroupRegistry::~GroupRegistry() {
  {
    absl::MutexLock lock(&watchdog_mu_);
    watchdog_stop_ = true;
  }
  if (watchdog_.joinable()) watchdog_.join();
  absl::MutexLock lock(&mu_);
  for (auto& [id, group] : groups_) {
    absl::MutexLock group_lock(&group->mu);
    if (group->comm) group->comm->Abort();
  }
}

std::string GroupRegistry::DescribeTransport() const {
  return transport_ == nullptr ? "" : transport_->Describe();
}

absl::StatusOr<GroupRegistry::Created> GroupRegistry::Create(GroupConfig config) {
  if (transport_ == nullptr) {
    return absl::FailedPreconditionError(
        "CreateGroup: context-parallel groups need the CUDA backend (NCCL); this server has none");
  }
  if (stopping_.load()) return absl::UnavailableError("samplerd is shutting down");
  if (config.world_size < 1 || config.world_size > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size: ", config.world_size, " is outside [1, 4096]"));
  }
  const int64_t packet_bytes = GroupPacketBytes(config.max_step_tokens);
  if (packet_bytes < 0 || config.max_step_tokens > options_.max_step_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("max_step_tokens: ", config.max_step_tokens,
                                                   " is outside [1, ", options_.max_step_tokens,
                                                   "] (the server's max_rows)"));
  }
  if (config.max_logits_bytes < 0 || config.max_logits_bytes > options_.max_logits_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("max_logits_bytes: ", config.max_logits_bytes,
                                                   " is outside [0, ", options_.max_logits_bytes,
                                                   "] (--max_group_logits_bytes)"));
  }
  if (config.join_timeout < absl::ZeroDuration() || config.join_timeout > options_.max_join_timeout) {
    return absl::InvalidArgumentError(absl::StrCat(
        "join_timeout_ms: ", absl::ToInt64Milliseconds(config.join_timeout), " is outside [0, ",
        absl::ToInt64Milliseconds(options_.max_join_timeout), "]"));
  }
  if (config.op_timeout < absl::ZeroDuration() || config.op_timeout > absl::Minutes(10)) {
    return absl::InvalidArgumentError(
        absl::StrCat("op_timeout_ms: ", absl::ToInt64Milliseconds(config.op_timeout),
                     " is outside [0, 600000]"));
  }
  if (config.join_timeout == absl::ZeroDuration()) config.join_timeout = options_.default_join_timeout;
  if (config.op_timeout == absl::ZeroDuration()) config.op_timeout = options_.default_op_timeout;
  std::string id;
  {
    absl::MutexLock lock(&mu_);
    if (static_cast<int>(groups_.size()) >= options_.max_groups) {
      // Failed groups hold nothing anyone can use: the oldest goes first.
      for (auto it = groups_.begin(); it != groups_.end(); ++it) {
        absl::MutexLock group_lock(&it->second->mu);
        if (it->second->state == GroupState::kFailed && it->second->users == 0) {
          spdlog::info("group '{}' (failed: {}) dropped to make room", it->first,
                       it->second->error);
          it->second->destroyed = true;
          groups_.erase(it);
          break;
        }
      }
    }
    if (static_cast<int>(groups_.size()) >= options_.max_groups) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "CreateGroup: ", groups_.size(), " groups exist (--max_groups); destroy one first"));
    }
    // A counter keeps ids unique; the random part keeps an old id from naming a new group
    // after a restart.
    std::random_device random;
    id = absl::StrFormat("cp%d-%08x", next_id_++, random());
  }
  auto unique_id = transport_->NewUniqueId();
  if (!unique_id.ok()) return unique_id.status();
  auto comm = transport_->StartJoin(*unique_id, config);
  if (!comm.ok()) return comm.status();
  auto group = std::make_shared<Group>();
  group->id = id;
  group->config = config;
  group->join_deadline = absl::Now() + config.join_timeout;
  {
    absl::MutexLock group_lock(&group->mu);
    group->comm = std::move(*comm);
  }
  {
    absl::MutexLock lock(&mu_);
    groups_[id] = group;
  }
  spdlog::info("group '{}' created: world_size {}, max_step_tokens {}, device {}, join within {}",
               id, config.world_size, config.max_step_tokens, config.device_id,
               Millis(config.join_timeout));
  return Created{id, *unique_id, packet_bytes};
}

void GroupRegistry::FailLocked(Group& group, const std::string& reason) {
  if (group.state == GroupState::kFailed) return;
  if (group.comm) group.comm->Abort();
  group.state = GroupState::kFailed;
  group.error = reason;
  group.op_in_flight = false;
  if (group.destroyed) return;  // DestroyGroup is not a failure
  failures_.fetch_add(1);
  spdlog::error("group '{}' failed and was aborted: {}", group.id, reason);
  if (on_failure_) on_failure_(group.id, reason);
}

absl::Status GroupRegistry::Destroy(const std::string& group_id) {
  std::shared_ptr<Group> group;
  {
    absl::MutexLock lock(&mu_);
    auto it = groups_.find(group_id);
    if (it == groups_.end()) {
      return absl::NotFoundError(absl::StrCat("group_id: no group '", group_id, "'"));
    }
    group = it->second;
    groups_.erase(it);
  }
  DestroyGroup(group);
  return absl::OkStatus();
}

void GroupRegistry::DestroyGroup(const std::shared_ptr<Group>& group) {
  absl::MutexLock lock(&group->mu);
  if (group->state == GroupState::kReady && group->IdleLocked() && group->comm) {
    // Tell the followers the group ends: a packet whose step status is UNAVAILABLE and whose
    // flags (word 7) say "closing". Then the orderly teardown.
    std::vector<int32_t> words = PackStepError(
        0, absl::UnavailableError("group closed"), group->config.max_step_tokens);
    words[7] = 1;
    absl::Status sent = group->comm->StartBroadcast(words.data(), words.size());
    const absl::Time deadline = absl::Now() + group->config.op_timeout;
    while (sent.ok()) {
      auto progress = group->comm->PollOps();
      if (!progress.ok()) sent = progress.status();
      else if (*progress == GroupComm::Progress::kDone) break;
      else if (absl::Now() > deadline) sent = absl::DeadlineExceededError("closing broadcast");
      else absl::SleepFor(absl::Microseconds(50));
    }
    const absl::Status finalized =
        sent.ok() ? group->comm->Finalize(group->config.op_timeout) : sent;
    if (!finalized.ok()) {
      group->comm->Abort();
      spdlog::warn("group '{}': closing it cleanly failed ({}); aborted", group->id,
                   finalized.ToString());
    }
  } else if (group->comm) {
    group->comm->Abort();
  }
  group->destroyed = true;
  if (group->state != GroupState::kFailed) {
    group->state = GroupState::kFailed;
    group->error = "destroyed by DestroyGroup";
  }
  group->op_in_flight = false;
  spdlog::info("group '{}' destroyed after {} steps", group->id, group->steps);
}

std::vector<GroupInfo> GroupRegistry::List() const {
  std::vector<std::shared_ptr<Group>> groups;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, group] : groups_) groups.push_back(group);
  }
  std::vector<GroupInfo> out;
  for (const auto& group : groups) {
    absl::MutexLock lock(&group->mu);
    out.push_back({group->id, group->state, group->config, group->steps, group->error});
  }
  return out;
}

absl::StatusOr<std::unique_ptr<GroupStep>> GroupRegistry::BeginStep(const std::string& group_id,
                                                                    const std::string& field) {
  if (stopping_.load()) return absl::UnavailableError("samplerd is shutting down");
  std::shared_ptr<Group> group;
  {
    absl::MutexLock lock(&mu_);
    auto it = groups_.find(group_id);
    if (it == groups_.end()) {
      return absl::NotFoundError(absl::StrCat(field, ": no group '", group_id, "'"));
    }
    group = it->second;
  }
  absl::MutexLock lock(&group->mu);
  if (group->state == GroupState::kJoining) {
    return absl::FailedPreconditionError(absl::StrCat(
        field, ": group '", group_id, "' is still joining: not every one of its ",
        group->config.world_size, " ranks has joined"));
  }
  if (group->state == GroupState::kFailed) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, ": group '", group_id, "' has failed: ", group->error));
  }
  const uint64_t ticket = group->next_ticket++;
  ++group->users;
  Group* g = group.get();
  auto turn = [g, ticket]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(g->mu) {
    return g->serving == ticket || g->state != GroupState::kReady;
  };
  group->mu.Await(absl::Condition(&turn));
  if (group->state != GroupState::kReady) {
    --group->users;
    return GroupUnavailable(*group, group->error);
  }
  return std::unique_ptr<GroupStep>(new GroupStep(this, std::move(group), ticket));
}

void GroupRegistry::Shutdown(absl::Duration timeout) {
  stopping_.store(true);
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<std::shared_ptr<Group>> groups;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, group] : groups_) groups.push_back(group);
    groups_.clear();
  }
  for (const auto& group : groups) {
    {
      absl::MutexLock lock(&group->mu);
      auto idle = [g = group.get()]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(g->mu) {
        return g->IdleLocked() || g->state != GroupState::kReady;
      };
      group->mu.AwaitWithDeadline(absl::Condition(&idle), deadline);
    }
    DestroyGroup(group);
  }
}

void GroupRegistry::Watchdog() {
  while (true) {
    {
      absl::MutexLock lock(&watchdog_mu_);
      if (watchdog_mu_.AwaitWithTimeout(absl::Condition(&watchdog_stop_),
                                        options_.watchdog_interval)) {
        return;
      }
    }
    std::vector<std::shared_ptr<Group>> groups;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [id, group] : groups_) groups.push_back(group);
    }
    const absl::Time now = absl::Now();
    for (const auto& group : groups) {
      absl::MutexLock lock(&group->mu);
      if (group->destroyed) continue;
      if (group->state == GroupState::kFailed) {
        // Nothing uses a failed group's buffers once no step holds it: free them (it stays
        // listed, with its error, until DestroyGroup or until Create needs its slot).
        if (group->users == 0 && group->comm) group->comm.reset();
        continue;
      }
      if (group->state == GroupState::kJoining) {
        auto progress = group->comm->PollJoin();
        if (!progress.ok()) {
          FailLocked(*group, absl::StrCat("join failed: ", progress.status().message()));
        } else if (*progress == GroupComm::Progress::kDone) {
          group->state = GroupState::kReady;
          spdlog::info("group '{}' is ready: all {} ranks joined", group->id,
                       group->config.world_size);
        } else if (now > group->join_deadline) {
          FailLocked(*group, absl::StrCat("join timed out after ", Millis(group->config.join_timeout),
                                          ": not every one of its ", group->config.world_size,
                                          " ranks joined"));
        }
      } else if (group->state == GroupState::kReady) {
        if (group->op_in_flight) {
          if (now > group->op_deadline) {
            FailLocked(*group, absl::StrCat("an operation missed its deadline (op_timeout ",
                                            Millis(group->config.op_timeout),
                                            "): a follower stopped or vanished"));
          }
        } else if (auto progress = group->comm->PollOps(); !progress.ok()) {
          FailLocked(*group, absl::StrCat("transport error while idle: ",
                                          progress.status().message()));
        }
      }
    }
  }
}

GroupStep::~GroupStep() {
  absl::MutexLock lock(&group_->mu);
  if (group_->serving == ticket_) ++group_->serving;
  --group_->users;
}

const std::string& GroupStep::group_id() const { return group_->id; }

void GroupStep::FailGroup(const std::string& reason) {
  absl::MutexLock lock(&group_->mu);
  registry_->FailLocked(*group_, reason);
}
int64_t GroupStep::max_step_tokens() const { return group_->config.max_step_tokens; }

absl::Status GroupStep::RunOp(const std::function<absl::Status()>& start, const char* what) {
  Group& g = *group_;
  {
    absl::MutexLock lock(&g.mu);
    if (g.state != GroupState::kReady) return GroupUnavailable(g, g.error);
    if (absl::Status started = start(); !started.ok()) {
      registry_->FailLocked(g, absl::StrCat(what, " could not start: ", started.message()));
      return GroupUnavailable(g, g.error);
    }
    g.op_in_flight = true;
    g.op_deadline = absl::Now() + g.config.op_timeout;
  }
  // Poll: spin briefly (an NCCL broadcast of a few KB completes in microseconds), then back
  // off. The watchdog enforces the same deadline should this thread be descheduled.
  for (int spins = 0;; ++spins) {
    {
      absl::MutexLock lock(&g.mu);
      if (g.state != GroupState::kReady) return GroupUnavailable(g, g.error);
      auto progress = g.comm->PollOps();
      if (!progress.ok()) {
        registry_->FailLocked(g, absl::StrCat(what, " failed: ", progress.status().message()));
        return GroupUnavailable(g, g.error);
      }
      if (*progress == GroupComm::Progress::kDone) {
        g.op_in_flight = false;
        return absl::OkStatus();
      }
      if (absl::Now() > g.op_deadline) {
        registry_->FailLocked(g, absl::StrCat(what, " missed its deadline (op_timeout ",
                                              Millis(g.config.op_timeout),
                                              "): a follower stopped or vanished"));
        return GroupUnavailable(g, g.error);
      }
    }
    if (spins < 200) {
      std::this_thread::yield();
    } else {
      absl::SleepFor(absl::Microseconds(20));
    }
  }
}

absl::StatusOr<const void*> GroupStep::ReceiveLogits(int64_t bytes, int src_rank,
                                                     const std::string& field, bool* on_device) {
  Group& g = *group_;
  const int64_t offset = (logits_used_ + 255) / 256 * 256;  // each shard 256-byte aligned
  absl::Status invalid;
  if (src_rank < 1 || src_rank >= g.config.world_size) {
    invalid = absl::InvalidArgumentError(absl::StrCat(
        field, ".nccl.src_rank: ", src_rank, " is outside [1, ", g.config.world_size - 1,
        "] (rank 0 is samplerd)"));
  } else if (bytes > g.config.max_logits_bytes - offset) {
    invalid = absl::InvalidArgumentError(absl::StrCat(
        field, ": ", bytes, " bytes of NCCL logits (at offset ", offset,
        ") exceed the group's max_logits_bytes = ", g.config.max_logits_bytes));
  }
  if (!invalid.ok()) {
    // The sender has posted (or will post) a send this server will never match: the group's
    // order is broken for good.
    absl::MutexLock lock(&g.mu);
    registry_->FailLocked(g, absl::StrCat("a step's NCCL logits could not be received: ",
                                          invalid.message()));
    return invalid;
  }
  GroupComm* comm = nullptr;
  {
    absl::MutexLock lock(&g.mu);
    comm = g.comm.get();
  }
  absl::Status received = RunOp([&] { return comm->StartRecv(offset, bytes, src_rank); },
                                "receiving NCCL logits");
  if (!received.ok()) return received;
  logits_used_ = offset + bytes;
  *on_device = comm->logits_on_device();
  return static_cast<const char*>(comm->logits_buffer()) + offset;
}

absl::Status GroupStep::Broadcast(const std::vector<int32_t>& words) {
  Group& g = *group_;
  GroupComm* comm = nullptr;
  {
    absl::MutexLock lock(&g.mu);
    comm = g.comm.get();
  }
  absl::Status sent = RunOp([&] { return comm->StartBroadcast(words.data(), words.size()); },
                            "broadcasting the step's results");
  if (sent.ok()) {
    absl::MutexLock lock(&g.mu);
    ++g.steps;
  }
  return sent;
}

}  // namespace samplerd
