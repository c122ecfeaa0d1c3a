// HostKvCopier: a KvCopier over host memory, so that the KV staging paths
// of the workers run on the CPU backend in tests; and CopierBackend, a
// backend that hands one out as its kv_copier().
//
// Copies are real (memcpy), but a copy lands only when it finishes: when
// the test says so (Complete, CompleteAll), or, with finish_after_polls N,
// once N Finished() calls have been made since it was queued. Until then
// its destination keeps its old bytes (staging starts filled with 0xFF, NaN
// as f32), so a worker that uses a destination before its copy finished
// ships or computes with garbage. Copies finish in queue order, as the
// interface promises.
//
// Failures: FailQueueing(status) makes ToHost / ToDevice return `status`;
// FailPending(status) ends every copy in flight with `status` (its bytes
// never land), as a broken device would.
//
// Thread-safe: the test thread completes and inspects copies that a
// worker's thread queues and polls.
#ifndef TANDEM_TESTS_TESTING_HOST_KV_COPIER_H_
#define TANDEM_TESTS_TESTING_HOST_KV_COPIER_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/compute/backend.h"
#include "tests/testing/forwarding_backend.h"

namespace tandem::testing {

class HostKvCopier final : public KvCopier {
 public:
  // 0: copies finish only when the test says so.
  explicit HostKvCopier(int finish_after_polls = 0) : finish_after_polls_(finish_after_polls) {}

  absl::StatusOr<std::unique_ptr<DeviceBuffer>> AllocateStaging(size_t bytes) override {
    absl::MutexLock lock(&mu_);
    ++staging_allocations_;
    staging_bytes_ += bytes;
    return std::unique_ptr<DeviceBuffer>(new Buffer(bytes));
  }

  absl::StatusOr<uint64_t> ToHost(const void* device, void* host,
                                  std::span<const CopyRange> ranges) override {
    absl::MutexLock lock(&mu_);
    ++to_host_calls_;
    return Queue(device, host, ranges, /*to_device=*/false);
  }

  absl::StatusOr<uint64_t> ToDevice(const void* host, void* device,
                                    std::span<const CopyRange> ranges) override {
    absl::MutexLock lock(&mu_);
    ++to_device_calls_;
    return Queue(host, device, ranges, /*to_device=*/true);
  }

  absl::StatusOr<bool> Finished(uint64_t ticket) override {
    absl::MutexLock lock(&mu_);
    ++finished_calls_;
    if (ticket == 0 || ticket >= next_ticket_) {
      return absl::NotFoundError(absl::StrCat("no KV copy has ticket ", ticket));
    }
    if (finish_after_polls_ > 0) {
      for (Copy& c : pending_) ++c.polls;
      while (!pending_.empty() && pending_.front().polls >= finish_after_polls_) LandFront();
    }
    if (auto it = failed_.find(ticket); it != failed_.end()) return it->second;
    return pending_.empty() || ticket < pending_.front().ticket;
  }

  // Lands the `n` oldest copies in flight (fewer if fewer are).
  void Complete(int n = 1) {
    absl::MutexLock lock(&mu_);
    for (int i = 0; i < n && !pending_.empty(); ++i) LandFront();
  }
  void CompleteAll() {
    absl::MutexLock lock(&mu_);
    while (!pending_.empty()) LandFront();
  }
  // Ends every copy in flight with `status`; their bytes never land.
  void FailPending(const absl::Status& status) {
    absl::MutexLock lock(&mu_);
    for (const Copy& c : pending_) failed_[c.ticket] = status;
    pending_.clear();
  }
  // ToHost and ToDevice return `status` from now on (OK: they work again).
  void FailQueueing(const absl::Status& status) {
    absl::MutexLock lock(&mu_);
    queue_failure_ = status;
  }

  // Waits until at least `n` copies are in flight; false after `timeout`.
  bool WaitForPending(int n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return static_cast<int>(pending_.size()) >= n;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }

  int pending() const {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(pending_.size());
  }
  // Whether the oldest copy in flight goes to the device.
  bool front_to_device() const {
    absl::MutexLock lock(&mu_);
    return !pending_.empty() && pending_.front().to_device;
  }
  int to_host_calls() const {
    absl::MutexLock lock(&mu_);
    return to_host_calls_;
  }
  int to_device_calls() const {
    absl::MutexLock lock(&mu_);
    return to_device_calls_;
  }
  int finished_calls() const {
    absl::MutexLock lock(&mu_);
    return finished_calls_;
  }
  // Bytes that landed, by direction.
  uint64_t to_host_bytes() const {
    absl::MutexLock lock(&mu_);
    return to_host_bytes_;
  }
  uint64_t to_device_bytes() const {
    absl::MutexLock lock(&mu_);
    return to_device_bytes_;
  }
  int staging_allocations() const {
    absl::MutexLock lock(&mu_);
    return staging_allocations_;
  }
  size_t staging_bytes() const {
    absl::MutexLock lock(&mu_);
    return staging_bytes_;
  }

 private:
  class Buffer final : public DeviceBuffer {
   public:
    explicit Buffer(size_t bytes) : bytes_(bytes, std::byte{0xFF}) {}
    void* data() override { return bytes_.data(); }
    size_t size() const override { return bytes_.size(); }

   private:
    std::vector<std::byte> bytes_;
  };

  struct Copy {
    uint64_t ticket;
    const std::byte* src;
    std::byte* dst;
    std::vector<CopyRange> ranges;
    bool to_device;
    int polls = 0;
  };

  absl::StatusOr<uint64_t> Queue(const void* src, void* dst, std::span<const CopyRange> ranges,
                                 bool to_device) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!queue_failure_.ok()) return queue_failure_;
    const uint64_t ticket = next_ticket_++;
    pending_.push_back(Copy{ticket, static_cast<const std::byte*>(src),
                            static_cast<std::byte*>(dst),
                            std::vector<CopyRange>(ranges.begin(), ranges.end()), to_device});
    return ticket;
  }

  void LandFront() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const Copy& c = pending_.front();
    for (const CopyRange& r : c.ranges) {
      std::memcpy(c.dst + r.dst_offset, c.src + r.src_offset, r.bytes);
      (c.to_device ? to_device_bytes_ : to_host_bytes_) += r.bytes;
    }
    pending_.pop_front();
  }

  const int finish_after_polls_;
  mutable absl::Mutex mu_;
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  std::deque<Copy> pending_ ABSL_GUARDED_BY(mu_);  // Queue order.
  absl::flat_hash_map<uint64_t, absl::Status> failed_ ABSL_GUARDED_BY(mu_);
  absl::Status queue_failure_ ABSL_GUARDED_BY(mu_);
  int to_host_calls_ ABSL_GUARDED_BY(mu_) = 0;
  int to_device_calls_ ABSL_GUARDED_BY(mu_) = 0;
  int finished_calls_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t to_host_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t to_device_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int staging_allocations_ ABSL_GUARDED_BY(mu_) = 0;
  size_t staging_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

// A backend (any inner one, the CPU backend in tests) that presents itself
// as one whose memory a transport cannot read: kv_copier() is `copier`,
// which it owns, so the workers stage their KV through it.
class CopierBackend final : public ForwardingBackend {
 public:
  CopierBackend(std::unique_ptr<Backend> inner, std::unique_ptr<HostKvCopier> copier)
      : ForwardingBackend(std::move(inner)), copier_(std::move(copier)) {}

  KvCopier* kv_copier() override { return copier_.get(); }
  HostKvCopier& copier() { return *copier_; }

 private:
  const std::unique_ptr<HostKvCopier> copier_;
};

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_TESTING_HOST_KV_COPIER_H_
