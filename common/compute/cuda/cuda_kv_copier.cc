#include "common/compute/cuda/cuda_kv_copier.h"

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/compute/cuda/cuda_status.h"

namespace tandem {
namespace {

class PinnedBuffer final : public DeviceBuffer {
 public:
  PinnedBuffer(void* data, size_t size) : data_(data), size_(size) {}
  ~PinnedBuffer() override { cudaFreeHost(data_); }
  void* data() override { return data_; }
  size_t size() const override { return size_; }

 private:
  void* data_;
  size_t size_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CudaKvCopier>> CudaKvCopier::Create(int device) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  cudaStream_t stream = nullptr;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return std::unique_ptr<CudaKvCopier>(new CudaKvCopier(device, stream));
}

CudaKvCopier::~CudaKvCopier() {
  cudaSetDevice(device_);
  cudaStreamSynchronize(stream_);
  for (const Pending& p : pending_) cudaEventDestroy(p.done);
  for (cudaEvent_t e : spare_) cudaEventDestroy(e);
  cudaStreamDestroy(stream_);
}

absl::StatusOr<std::unique_ptr<DeviceBuffer>> CudaKvCopier::AllocateStaging(size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("staging of 0 bytes");
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  void* data = nullptr;
  CUDA_RETURN_IF_ERROR(cudaHostAlloc(&data, bytes, cudaHostAllocPortable));
  return std::unique_ptr<DeviceBuffer>(new PinnedBuffer(data, bytes));
}

absl::StatusOr<cudaEvent_t> CudaKvCopier::TakeEvent() {
  if (!spare_.empty()) {
    cudaEvent_t e = spare_.back();
    spare_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

absl::StatusOr<uint64_t> CudaKvCopier::Queue(const void* src, void* dst,
                                             std::span<const CopyRange> ranges,
                                             bool after_compute) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  if (after_compute) {
    ASSIGN_OR_RETURN(cudaEvent_t computed, TakeEvent());
    absl::Status status = TANDEM_CUDA_STATUS(cudaEventRecord(computed, cudaStreamLegacy));
    if (status.ok()) status = TANDEM_CUDA_STATUS(cudaStreamWaitEvent(stream_, computed, 0));
    // The wait is queued: the event may be reused once it has been recorded
    // again later (recording replaces what waits capture at queue time).
    spare_.push_back(computed);
    RETURN_IF_ERROR(status);
  }
  dsts_.clear();
  srcs_.clear();
  sizes_.clear();
  for (const CopyRange& r : ranges) {
    if (r.bytes == 0) continue;
    const char* s = static_cast<const char*>(src) + r.src_offset;
    char* d = static_cast<char*>(dst) + r.dst_offset;
    if (!sizes_.empty() && static_cast<const char*>(srcs_.back()) + sizes_.back() == s &&
        static_cast<char*>(dsts_.back()) + sizes_.back() == d) {
      sizes_.back() += r.bytes;  // Adjacent on both sides: one copy.
      continue;
    }
    dsts_.push_back(d);
    srcs_.push_back(s);
    sizes_.push_back(r.bytes);
  }
  if (sizes_.size() == 1) {
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dsts_[0], srcs_[0], sizes_[0], cudaMemcpyDefault, stream_));
  } else if (!sizes_.empty()) {
    cudaMemcpyAttributes attrs{};
    attrs.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attrs.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t first = 0;
    CUDA_RETURN_IF_ERROR(cudaMemcpyBatchAsync(dsts_.data(), srcs_.data(), sizes_.data(),
                                              sizes_.size(), &attrs, &first, 1, stream_));
  }
  ASSIGN_OR_RETURN(cudaEvent_t done, TakeEvent());
  const absl::Status recorded = TANDEM_CUDA_STATUS(cudaEventRecord(done, stream_));
  if (!recorded.ok()) {
    spare_.push_back(done);
    return recorded;
  }
  const uint64_t ticket = next_ticket_++;
  pending_.push_back({ticket, done});
  return ticket;
}

absl::StatusOr<uint64_t> CudaKvCopier::ToHost(const void* device, void* host,
                                              std::span<const CopyRange> ranges) {
  return Queue(device, host, ranges, /*after_compute=*/true);
}

absl::StatusOr<uint64_t> CudaKvCopier::ToDevice(const void* host, void* device,
                                                std::span<const CopyRange> ranges) {
  // The destination is KV no queued kernel touches (blocks reserved for a
  // transfer), so the copy need not wait for the compute stream.
  return Queue(host, device, ranges, /*after_compute=*/false);
}

absl::StatusOr<bool> CudaKvCopier::Finished(uint64_t ticket) {
  // Copies finish in queue order: retire finished events from the front.
  while (!pending_.empty() && pending_.front().ticket <= ticket) {
    const cudaError_t e = cudaEventQuery(pending_.front().done);
    if (e == cudaErrorNotReady) return false;
    spare_.push_back(pending_.front().done);
    pending_.pop_front();
    if (e != cudaSuccess) {
      return TANDEM_CUDA_STATUS(e);
    }
  }
  if (ticket == 0 || ticket >= next_ticket_) {
    return absl::NotFoundError(absl::StrCat("no KV copy has ticket ", ticket));
  }
  return true;
}

}  // namespace tandem
