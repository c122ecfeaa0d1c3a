// Test harness for the transfer protocol: a TransferReceiver and a
// TransferSender on one InProcFabric, the sender's transport wrapped in a
// FaultyTransport, each side with a paged KV pool laid out as the engine lays
// it out. Time is a FakeClock: every poll round advances it by one
// millisecond, so deadlines fire without sleeping and every test runs a
// bounded number of rounds.
#ifndef TANDEM_TESTS_UNIT_KVTRANSFER_TRANSFER_HARNESS_H_
#define TANDEM_TESTS_UNIT_KVTRANSFER_TRANSFER_HARNESS_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "common/base/clock.h"
#include "common/kvcache/kv_layout.h"
#include "kvtransfer/faulty_transport.h"
#include "kvtransfer/inproc_transport.h"
#include "kvtransfer/slices.h"
#include "kvtransfer/transfer_receiver.h"
#include "kvtransfer/transfer_sender.h"

namespace tandem::kvtransfer::testing {

inline constexpr std::byte kSentinel{0xee};
inline constexpr absl::Duration kStep = absl::Milliseconds(1);

// A paged KV cache in host memory, laid out as the engine lays it out.
struct KvPool {
  KvLayout layout;
  std::vector<std::byte> bytes;
  RegionId region = 0;

  size_t block_bytes() const { return layout.block_bytes(); }
  size_t BlockOffset(int layer, int32_t block) const {
    return layout.BlockOffset(layer, block) * layout.element_bytes();
  }
  // A sequence holding `blocks` (in sequence order), layer by layer, as a
  // worker would send or receive it.
  std::vector<std::vector<Slice>> Slices(const std::vector<int32_t>& blocks) const {
    return PagedKvSlices(region, layout.n_layers, layout.layer_bytes(), block_bytes(), blocks);
  }
  std::string Block(int layer, int32_t block) const {
    const size_t offset = BlockOffset(layer, block);
    return std::string(reinterpret_cast<const char*>(bytes.data()) + offset, block_bytes());
  }
};

inline KvLayout Layout(int n_layers, int num_blocks, int block_size, int kv_dim) {
  KvLayout layout;
  layout.n_layers = n_layers;
  layout.num_blocks = num_blocks;
  layout.block_size = block_size;
  layout.kv_dim = kv_dim;
  return layout;
}

inline std::vector<int32_t> RandomBlocks(std::mt19937_64& rng, int num_blocks, int count) {
  std::vector<int32_t> all(num_blocks);
  for (int i = 0; i < num_blocks; ++i) all[i] = i;
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(count);
  // Mostly ascending with some runs, as a block pool hands them out.
  if (rng() % 2 == 0) std::sort(all.begin(), all.end());
  return all;
}

struct HarnessOptions {
  KvLayout layout = Layout(4, 16, 4, 8);
  ReceiverOptions receiver;
  SenderOptions sender;
  FaultPlan faults;
  uint64_t seed = 1;
};

// One receiver and one sender (whose transport injects faults) on a fabric,
// each with a KV pool; records every `done` call.
class Harness {
 public:
  explicit Harness(HarnessOptions options) : rng_(options.seed) {
    fabric_ = InProcFabric::Create();
    rx_transport_ = InProcTransport::Create(fabric_);
    auto faulty =
        std::make_unique<FaultyTransport>(InProcTransport::Create(fabric_), options.faults, &clock);
    faulty_ = faulty.get();
    tx_transport_ = std::move(faulty);
    receiver = std::make_unique<TransferReceiver>(rx_transport_.get(), &clock, options.receiver);
    sender = std::make_unique<TransferSender>(tx_transport_.get(), &clock, options.sender);
    src = MakePool(options.layout, /*random=*/true);
    dst = MakePool(options.layout, /*random=*/false);
    src.region =
        sender->RegisterMemory(src.bytes.data(), src.bytes.size(), MemoryKind::kHost).value();
    dst.region =
        receiver->RegisterMemory(dst.bytes.data(), dst.bytes.size(), MemoryKind::kHost).value();
  }

  KvPool MakePool(KvLayout layout, bool random) {
    KvPool pool;
    pool.layout = layout;
    pool.bytes.resize(layout.total_bytes(), kSentinel);
    if (random) {
      for (std::byte& b : pool.bytes) b = static_cast<std::byte>(rng_() & 0xff);
    }
    return pool;
  }

  absl::StatusOr<TransferLease> Expect(uint64_t request_id, const std::vector<int32_t>& blocks,
                                       absl::Duration timeout = absl::Milliseconds(200)) {
    return receiver->Expect(
        ReceiveRequest{.request_id = request_id,
                       .layers = dst.Slices(blocks),
                       .deadline = clock.Now() + timeout,
                       .done = [this](uint64_t id, uint64_t, const absl::Status& s) {
                         rx_done[id].push_back(s);
                       }});
  }

  absl::Status Start(const TransferLease& lease, const std::vector<int32_t>& blocks,
                     TransferSender* via = nullptr) {
    TransferSender& s = via != nullptr ? *via : *sender;
    return s
        .Start(SendRequest{
            .descriptor = lease.Serialize(),
            .layers = src.Slices(blocks),
            .deadline = absl::InfiniteFuture(),
            .done = [this](uint64_t id, const absl::Status& st) { tx_done[id].push_back(st); }})
        .status();
  }

  void Round() {
    sender->Poll();
    receiver->Poll();
    clock.Advance(kStep);
  }

  // Rounds until `pred` holds; false if it never did within `max_rounds`.
  template <typename Pred>
  bool RunUntil(Pred pred, int max_rounds = 2000) {
    for (int r = 0; r < max_rounds; ++r) {
      if (pred()) return true;
      Round();
    }
    return pred();
  }

  bool Ended(uint64_t id) const { return rx_done.contains(id) && tx_done.contains(id); }

  // Whether the destination blocks hold exactly the source blocks.
  bool Same(const std::vector<int32_t>& src_blocks, const std::vector<int32_t>& dst_blocks) const {
    for (int l = 0; l < src.layout.n_layers; ++l) {
      for (size_t i = 0; i < src_blocks.size(); ++i) {
        if (src.Block(l, src_blocks[i]) != dst.Block(l, dst_blocks[i])) return false;
      }
    }
    return true;
  }
  bool Untouched(const std::vector<int32_t>& dst_blocks) const {
    const std::string sentinel(dst.block_bytes(), static_cast<char>(kSentinel));
    for (int l = 0; l < dst.layout.n_layers; ++l) {
      for (int32_t b : dst_blocks) {
        if (dst.Block(l, b) != sentinel) return false;
      }
    }
    return true;
  }

  // Declared before the receiver and sender, whose destructors still run
  // `done` for what they hold.
  FakeClock clock;
  absl::flat_hash_map<uint64_t, std::vector<absl::Status>> rx_done, tx_done;
  KvPool src, dst;
  std::shared_ptr<InProcFabric> fabric_;
  std::unique_ptr<KvTransport> rx_transport_, tx_transport_;
  FaultyTransport* faulty_ = nullptr;
  std::unique_ptr<TransferReceiver> receiver;
  std::unique_ptr<TransferSender> sender;

 private:
  std::mt19937_64 rng_;
};

// Marks layers ready one per round, as a prefill computing layer by layer would.
inline void StreamLayers(Harness& h, uint64_t request_id, int n_layers) {
  for (int l = 0; l < n_layers; ++l) {
    absl::Status s = h.sender->MarkLayerReady(request_id, l);
    if (!s.ok()) return;  // The transfer already failed; the tests check how.
    h.Round();
  }
}

// Leases `dst` as request `request_id`, sends `src` into it layer by layer
// and runs until both sides have ended. An error means the transfer could
// not be set up or never ended; how it ended is in h.rx_done / h.tx_done.
inline absl::Status RunTransfer(Harness& h, uint64_t request_id, const std::vector<int32_t>& src,
                                const std::vector<int32_t>& dst, int n_layers) {
  absl::StatusOr<TransferLease> lease = h.Expect(request_id, dst);
  if (!lease.ok()) return lease.status();
  if (absl::Status s = h.Start(*lease, src); !s.ok()) return s;
  StreamLayers(h, request_id, n_layers);
  if (!h.RunUntil([&] { return h.Ended(request_id); })) {
    return absl::DeadlineExceededError("the transfer did not end within the round limit");
  }
  return absl::OkStatus();
}

}  // namespace tandem::kvtransfer::testing

#endif  // TANDEM_TESTS_UNIT_KVTRANSFER_TRANSFER_HARNESS_H_
