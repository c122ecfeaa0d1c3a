// ChunkVerifier: checks landed KV chunks against the XXH3-64 checksums their
// senders computed, either at once on the caller's thread or on an executor,
// so that the thread polling the transport goes on accepting (and, over
// shared memory, copying) the next chunks while this one is read back.
//
// Chunks smaller than the offload size are checked at once all the same: a
// thread is not woken for a few microseconds of hashing.
//
// A check's verdict comes out of Collect on the caller's thread, tagged as it
// was submitted. The caller keeps the checked bytes alive and unwritten until
// it has collected the verdict; a verifier destroyed earlier drops the
// verdicts of the checks still running, which finish reading on their own.
//
// Thread-compatible: one thread submits and collects; the checks run on the
// executor's threads.
#ifndef TANDEM_KVTRANSFER_CHUNK_VERIFIER_H_
#define TANDEM_KVTRANSFER_CHUNK_VERIFIER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/base/executor.h"

namespace tandem::kvtransfer {

class ChunkVerifier {
 public:
  struct Verdict {
    uint64_t tag;
    bool ok;  // The bytes hash to the expected checksum.
  };

  // `executor` runs the checks of chunks of at least `offload_bytes`, and
  // must run every check posted to it before the bytes it names are freed (a
  // ThreadPoolExecutor destroyed before the KV pool does); Submit checks
  // smaller chunks, and every chunk when `executor` is null, at once.
  explicit ChunkVerifier(Executor* executor, uint64_t offload_bytes = 0)
      : executor_(executor), offload_bytes_(offload_bytes) {}

  // Checks that `bytes` (in order) hash to `expected`.
  void Submit(uint64_t tag, std::vector<std::span<const std::byte>> bytes, uint64_t expected);
  // Appends the verdicts reached since the last call.
  void Collect(std::vector<Verdict>& out);
  // Submitted checks whose verdict has not been collected.
  size_t outstanding() const { return outstanding_; }

 private:
  struct Ready {
    absl::Mutex mu;
    std::vector<Verdict> verdicts ABSL_GUARDED_BY(mu);
  };

  Executor* const executor_;
  const uint64_t offload_bytes_;
  // Shared with the checks in flight, which may outlive the verifier.
  const std::shared_ptr<Ready> ready_ = std::make_shared<Ready>();
  size_t outstanding_ = 0;
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_CHUNK_VERIFIER_H_
