// The CUDA backend's KvCopier: page-locked host staging, and copies on a
// stream of their own (non-blocking, so they overlap the kernels on the
// legacy default stream) ordered after the compute work by events.
// Internal to the CUDA backend: CudaBackend::kv_copier() hands it out.
//
// Ownership: the backend owns the copier, and the copier its stream and
// events; staging it allocates (page-locked) belongs to the returned
// DeviceBuffer. Thread-compatible: the worker's loop thread, which also
// drives the backend, queues and polls the copies. A CUDA error is
// returned as a status by the call that meets it (CudaStatus: naming the
// CUDA call), a copy that failed on the device reports its error from
// Finished, and an unknown ticket is NOT_FOUND; nothing is retried.
#ifndef TANDEM_COMMON_COMPUTE_CUDA_CUDA_KV_COPIER_H_
#define TANDEM_COMMON_COMPUTE_CUDA_CUDA_KV_COPIER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/compute/backend.h"

struct CUstream_st;
struct CUevent_st;

namespace tandem {

class CudaKvCopier final : public KvCopier {
 public:
  // Creates the copy stream and the events on `device` (made current).
  static absl::StatusOr<std::unique_ptr<CudaKvCopier>> Create(int device);
  ~CudaKvCopier() override;

  absl::StatusOr<std::unique_ptr<DeviceBuffer>> AllocateStaging(size_t bytes) override;
  absl::StatusOr<uint64_t> ToHost(const void* device, void* host,
                                  std::span<const CopyRange> ranges) override;
  absl::StatusOr<uint64_t> ToDevice(const void* host, void* device,
                                    std::span<const CopyRange> ranges) override;
  absl::StatusOr<bool> Finished(uint64_t ticket) override;

 private:
  struct Pending {
    uint64_t ticket;
    CUevent_st* done;
  };

  CudaKvCopier(int device, CUstream_st* stream) : device_(device), stream_(stream) {}
  // Queues the copies (adjacent ranges merged) on the copy stream, after the
  // legacy stream's work so far when `after_compute`; returns the ticket.
  absl::StatusOr<uint64_t> Queue(const void* src, void* dst, std::span<const CopyRange> ranges,
                                 bool after_compute);
  absl::StatusOr<CUevent_st*> TakeEvent();

  int device_;
  CUstream_st* stream_;
  uint64_t next_ticket_ = 1;
  std::deque<Pending> pending_;     // In queue order.
  std::vector<CUevent_st*> spare_;  // Recorded-and-finished events to reuse.
  // Per-call scratch for the batched copy.
  std::vector<void*> dsts_;
  std::vector<const void*> srcs_;
  std::vector<size_t> sizes_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_COMPUTE_CUDA_CUDA_KV_COPIER_H_
