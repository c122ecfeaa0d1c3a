// The decode side of the two-process KV transfer tests: a KV-cache-shaped
// region, a random block table, and a lease over it; then a check that every
// leased byte holds the sender's pattern and every other byte is untouched.
// Shared by the gtest process and kv_receiver_peer (which runs it inside
// another network namespace).
#ifndef TANDEM_TESTS_E2E_KV_RECEIVER_SIDE_H_
#define TANDEM_TESTS_E2E_KV_RECEIVER_SIDE_H_

#include <algorithm>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/clock.h"
#include "common/base/status_macros.h"
#include "kvtransfer/transfer_receiver.h"
#include "kvtransfer/ucx/ucx_transport.h"
#include "tests/e2e/kv_pattern.h"

namespace tandem::kvtransfer {

struct Shape {
  int layers;
  int num_blocks;  // in the cache
  int seq_blocks;  // held by the sequence
  uint64_t block_bytes;
  int lanes;
  uint64_t chunk_bytes;
  bool checksums;
  std::string tls;  // UCX_TLS, "" = UCX's default
};

class KvReceiverSide {
 public:
  static absl::StatusOr<std::unique_ptr<KvReceiverSide>> Create(const Shape& shape, uint64_t seed) {
    std::unique_ptr<KvReceiverSide> side(new KvReceiverSide(shape, seed));
    ASSIGN_OR_RETURN(side->transport_, UcxTransport::Create());
    ReceiverOptions options;
    options.chunk_bytes = shape.chunk_bytes;
    options.checksums = shape.checksums;
    side->receiver_ =
        std::make_unique<TransferReceiver>(side->transport_.get(), &Clock::Real(), options);
    ASSIGN_OR_RETURN(side->region_,
                     side->receiver_->RegisterMemory(side->cache_.data(), side->cache_.size(),
                                                     MemoryKind::kHost));
    return side;
  }

  ~KvReceiverSide() { receiver_.reset(); }

  // Opens the lease; returns the descriptor for the sender.
  absl::StatusOr<std::string> Lease(absl::Duration deadline) {
    ReceiveRequest request;
    request.request_id = 42;
    for (int l = 0; l < shape_.layers; ++l) {
      std::vector<Slice> slices;
      for (int32_t b : table_) {
        const uint64_t offset = (uint64_t(l) * shape_.num_blocks + b) * shape_.block_bytes;
        if (!slices.empty() && slices.back().offset + slices.back().length == offset) {
          slices.back().length += shape_.block_bytes;
        } else {
          slices.push_back(Slice{region_, offset, shape_.block_bytes});
        }
      }
      request.layers.push_back(std::move(slices));
    }
    request.deadline = absl::Now() + deadline;
    request.done = [this](uint64_t, uint64_t, const absl::Status& status) {
      ++done_calls_;
      status_ = status;
    };
    ASSIGN_OR_RETURN(TransferLease lease, receiver_->Expect(std::move(request)));
    return lease.Serialize();
  }

  // Polls until the lease ends or `timeout` passes.
  void RunUntilDone(absl::Duration timeout) {
    const absl::Time until = absl::Now() + timeout;
    while (done_calls_ == 0 && absl::Now() < until) {
      receiver_->Poll();
      receiver_->WaitForActivity(absl::Now() + absl::Milliseconds(5));
    }
  }

  // OK when every leased byte holds the sender's pattern and every other
  // byte the poison.
  absl::Status CheckBytes() const {
    std::vector<uint8_t> expected(cache_.size(), kPoison);
    std::vector<uint8_t> layer(table_.size() * shape_.block_bytes);
    for (int l = 0; l < shape_.layers; ++l) {
      testing::FillKvPattern(seed_, l, layer.data(), layer.size());
      for (size_t i = 0; i < table_.size(); ++i) {
        std::copy_n(
            layer.begin() + i * shape_.block_bytes, shape_.block_bytes,
            expected.begin() + (uint64_t(l) * shape_.num_blocks + table_[i]) * shape_.block_bytes);
      }
    }
    const auto mismatch = std::mismatch(cache_.begin(), cache_.end(), expected.begin());
    if (mismatch.first == cache_.end()) return absl::OkStatus();
    return absl::DataLossError(
        absl::StrCat("first wrong byte at offset ", mismatch.first - cache_.begin()));
  }

  TransferReceiver& receiver() { return *receiver_; }
  int done_calls() const { return done_calls_; }
  const absl::Status& status() const { return status_; }

 private:
  static constexpr uint8_t kPoison = 0xAB;

  KvReceiverSide(const Shape& shape, uint64_t seed) : shape_(shape), seed_(seed) {
    cache_.assign(uint64_t(shape.layers) * shape.num_blocks * shape.block_bytes, kPoison);
    std::vector<int32_t> ids(shape.num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::mt19937_64 rng(seed);
    std::shuffle(ids.begin(), ids.end(), rng);
    // Some adjacent runs too, as the pool hands them out.
    std::sort(ids.begin(), ids.begin() + shape.seq_blocks / 2);
    table_.assign(ids.begin(), ids.begin() + shape.seq_blocks);
  }

  Shape shape_;
  uint64_t seed_;
  std::unique_ptr<UcxTransport> transport_;
  std::unique_ptr<TransferReceiver> receiver_;
  std::vector<uint8_t> cache_;
  RegionId region_ = 0;
  std::vector<int32_t> table_;
  int done_calls_ = 0;
  absl::Status status_;
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_TESTS_E2E_KV_RECEIVER_SIDE_H_
