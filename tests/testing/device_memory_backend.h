// DeviceMemoryBackend: another backend (e.g. the CPU one) posing as one on a
// device of a given size, for tests of what is sized from device memory:
// QueryDeviceMemory reports that size, with what was allocated through it
// (and not freed yet) as used.
#ifndef TANDEM_TESTS_TESTING_DEVICE_MEMORY_BACKEND_H_
#define TANDEM_TESTS_TESTING_DEVICE_MEMORY_BACKEND_H_

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <memory>
#include <optional>
#include <utility>

#include "absl/status/statusor.h"
#include "common/base/status_macros.h"
#include "common/compute/backend.h"
#include "tests/testing/forwarding_backend.h"

namespace tandem::testing {

class DeviceMemoryBackend final : public ForwardingBackend {
 public:
  DeviceMemoryBackend(std::unique_ptr<Backend> inner, size_t total_bytes)
      : ForwardingBackend(std::move(inner)), total_bytes_(total_bytes) {}

  // Bytes allocated through this backend and not freed yet. Thread-safe.
  size_t allocated() const { return allocated_->load(); }

  std::optional<DeviceMemory> QueryDeviceMemory() override {
    const size_t used = std::min(allocated(), total_bytes_);
    return DeviceMemory{.free_bytes = total_bytes_ - used, .total_bytes = total_bytes_};
  }

  absl::StatusOr<std::unique_ptr<DeviceBuffer>> Allocate(size_t bytes) override {
    ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> inner, ForwardingBackend::Allocate(bytes));
    return std::unique_ptr<DeviceBuffer>(new Counted(std::move(inner), allocated_));
  }

 private:
  // A buffer of the inner backend, counted while it lives (it may outlive
  // the backend, hence the shared count).
  class Counted final : public DeviceBuffer {
   public:
    Counted(std::unique_ptr<DeviceBuffer> inner, std::shared_ptr<std::atomic<size_t>> count)
        : inner_(std::move(inner)), count_(std::move(count)) {
      count_->fetch_add(inner_->size());
    }
    ~Counted() override { count_->fetch_sub(inner_->size()); }
    void* data() override { return inner_->data(); }
    size_t size() const override { return inner_->size(); }

   private:
    const std::unique_ptr<DeviceBuffer> inner_;
    const std::shared_ptr<std::atomic<size_t>> count_;
  };

  const size_t total_bytes_;
  const std::shared_ptr<std::atomic<size_t>> allocated_ = std::make_shared<std::atomic<size_t>>(0);
};

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_TESTING_DEVICE_MEMORY_BACKEND_H_
