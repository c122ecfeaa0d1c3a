#include "kvtransfer/chunk_verifier.h"

#include <utility>

#include "kvtransfer/slices.h"

namespace tandem::kvtransfer {

void ChunkVerifier::Submit(uint64_t tag, std::vector<std::span<const std::byte>> bytes,
                           uint64_t expected) {
  ++outstanding_;
  uint64_t total = 0;
  for (std::span<const std::byte> part : bytes) total += part.size();
  auto check = [ready = ready_, tag, bytes = std::move(bytes), expected] {
    const bool ok = Xxh3Of(bytes) == expected;
    absl::MutexLock lock(&ready->mu);
    ready->verdicts.push_back({tag, ok});
  };
  if (executor_ == nullptr || total < offload_bytes_) {
    check();
  } else {
    executor_->Post(std::move(check));
  }
}

void ChunkVerifier::Collect(std::vector<Verdict>& out) {
  if (outstanding_ == 0) return;
  std::vector<Verdict> got;
  {
    absl::MutexLock lock(&ready_->mu);
    got.swap(ready_->verdicts);
  }
  outstanding_ -= got.size();
  out.insert(out.end(), got.begin(), got.end());
}

}  // namespace tandem::kvtransfer
