#include "router/admission_queue.h"

#include <utility>

namespace tandem::router {

AdmissionQueue::AdmissionQueue(int max_running, int max_queued, absl::Duration timeout)
    : max_running_(max_running), max_queued_(max_queued), timeout_(timeout) {}

AdmissionQueue::Decision AdmissionQueue::Arrive(uint64_t id, int priority, absl::Time now) {
  if (running_ < max_running_ && order_.empty()) {
    ++running_;
    return Decision::kRun;
  }
  if (queued() >= max_queued_) return Decision::kFull;
  const Entry entry{.key = Key(-priority, sequence_++), .expires = now + timeout_};
  order_.emplace(entry.key, id);
  expiries_.emplace(entry.expires, id);
  entries_.emplace(id, entry);
  return Decision::kQueued;
}

std::optional<uint64_t> AdmissionQueue::Finish() {
  if (running_ > 0) --running_;
  if (order_.empty() || running_ >= max_running_) return std::nullopt;
  const uint64_t id = order_.begin()->second;
  Remove(id);
  ++running_;
  return id;
}

bool AdmissionQueue::Remove(uint64_t id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  order_.erase({it->second.key, id});
  expiries_.erase({it->second.expires, id});
  entries_.erase(it);
  return true;
}

std::vector<uint64_t> AdmissionQueue::Expire(absl::Time now) {
  std::vector<uint64_t> expired;
  while (!expiries_.empty() && expiries_.begin()->first <= now) {
    expired.push_back(expiries_.begin()->second);
    Remove(expired.back());
  }
  return expired;
}

absl::Time AdmissionQueue::next_expiry() const {
  return expiries_.empty() ? absl::InfiniteFuture() : expiries_.begin()->first;
}

}  // namespace tandem::router
