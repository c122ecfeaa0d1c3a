// Test helpers for the prefill worker: a synthetic model, and DecodeSide,
// which plays the decode worker: its own engine, an InProcTransport on the
// prefill worker's fabric and a TransferReceiver that leases blocks of its
// own engine. Once a transfer lands it continues the sequence on its engine,
// so that tests can compare with one engine generating alone.
//
// Thread-compatible: the test thread drives it (Pump) while waiting for the
// prefill worker, which runs on its own thread.
#ifndef TANDEM_TESTS_UNIT_PREFILL_WORKER_DECODE_SIDE_H_
#define TANDEM_TESTS_UNIT_PREFILL_WORKER_DECODE_SIDE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/base/logging.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/engine/engine.h"
#include "common/engine/generate.h"
#include "common/engine/sampler.h"
#include "common/model/synthetic.h"
#include "kvtransfer/inproc_transport.h"
#include "kvtransfer/transfer_receiver.h"
#include "prefill_worker/prefill_job.h"

namespace tandem::prefill::testing {

inline ModelConfig TestShape() {
  return ModelConfig{.dim = 64,
                     .hidden_dim = 96,
                     .n_layers = 3,
                     .n_heads = 8,
                     .n_kv_heads = 2,
                     .vocab_size = 101,
                     .seq_len = 128};
}

inline std::unique_ptr<Engine> MakeEngine(const ModelWeights& weights, int num_blocks) {
  auto backend = CpuBackend::Create(CpuBackendOptions{1});
  CHECK_OK(backend.status());
  EngineOptions options;
  options.num_blocks = num_blocks;
  options.max_batch_tokens = weights.config.seq_len;
  auto engine = Engine::Create(weights, std::move(backend).value(), options);
  CHECK_OK(engine.status());
  return std::move(engine).value();
}

inline std::vector<int32_t> RandomTokens(int n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& id : t) id = static_cast<int32_t>(rng() % vocab);
  return t;
}

// Greedy tokens of `prompt` on one engine alone: the first is the token the
// prefill worker must sample, the rest what decoding must continue with.
inline std::vector<int32_t> ReferenceTokens(Engine& engine, const std::vector<int32_t>& prompt,
                                            int n) {
  GenerateRequest request;
  request.prompt = prompt;
  request.max_new_tokens = n;
  auto result = Generate(engine, request);
  CHECK_OK(result.status());
  return result->tokens;
}

// The outcome of one PrefillLoop::Submit, filled from the loop's thread.
class Outcome {
 public:
  PrefillDoneFn Callback() {
    return [this](absl::StatusOr<PrefillResult> result) {
      absl::MutexLock lock(&mu_);
      ++calls_;
      result_ = std::move(result);
    };
  }
  bool done() const {
    absl::MutexLock lock(&mu_);
    return calls_ > 0;
  }
  int calls() const {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  absl::StatusOr<PrefillResult> result() const {
    absl::MutexLock lock(&mu_);
    return result_;
  }
  absl::Status status() const { return result().status(); }

 private:
  mutable absl::Mutex mu_;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  absl::StatusOr<PrefillResult> result_ ABSL_GUARDED_BY(mu_) = absl::UnknownError("no reply yet");
};

class DecodeSide {
 public:
  // One leased destination.
  struct Lease {
    uint64_t request_id = 0;
    int prompt_len = 0;
    BlockTable table;
    // The prompt blocks before this one are not leased (held already).
    int first_block = 0;
    std::string descriptor = "";
    bool ended = false;
    absl::Status status = absl::UnknownError("transfer still open");
  };

  DecodeSide(const ModelWeights& weights, std::shared_ptr<kvtransfer::InProcFabric> fabric,
             int num_blocks = 64, kvtransfer::ReceiverOptions options = {})
      : engine_(MakeEngine(weights, num_blocks)),
        transport_(kvtransfer::InProcTransport::Create(std::move(fabric))),
        receiver_(transport_.get(), &Clock::Real(), options) {
    // Take a few blocks first, so that destination block ids differ from
    // the prefill worker's source ids.
    CHECK_OK(filler_.Reserve(3 * engine_->kv_layout().block_size, engine_->block_pool()));
    auto region = receiver_.RegisterMemory(engine_->kv_cache(), engine_->kv_cache_bytes(),
                                           kvtransfer::MemoryKind::kHost);
    CHECK_OK(region.status());
    region_ = *region;
  }

  Engine& engine() { return *engine_; }
  kvtransfer::TransferReceiver& receiver() { return receiver_; }

  // Reserves room for `prompt_len` + `extra` tokens and leases the prompt's
  // blocks from `first_block` on. The layer slices are built here
  // independently of the worker's code (one slice per block, no merging), so
  // the test also checks that both sides agree on the byte order.
  Lease* Expect(int prompt_len, int extra = 16,
                absl::Time deadline = absl::Now() + absl::Seconds(60), int first_block = 0) {
    auto lease =
        std::make_unique<Lease>(Lease{next_id_++, prompt_len, engine_->NewSequence(), first_block});
    CHECK_OK(lease->table.Reserve(prompt_len + extra, engine_->block_pool()));
    const KvLayout& layout = engine_->kv_layout();
    const int prompt_blocks = (prompt_len + layout.block_size - 1) / layout.block_size;
    kvtransfer::ReceiveRequest request;
    request.request_id = lease->request_id;
    request.deadline = deadline;
    request.first_block = static_cast<uint32_t>(first_block);
    for (int l = 0; l < layout.n_layers; ++l) {
      std::vector<kvtransfer::Slice>& slices = request.layers.emplace_back();
      for (int b = first_block; b < prompt_blocks; ++b) {
        slices.push_back(kvtransfer::Slice{
            region_, layout.BlockOffset(l, lease->table.blocks()[b]) * layout.element_bytes(),
            layout.block_bytes()});
      }
    }
    Lease* raw = lease.get();
    request.done = [raw](uint64_t, uint64_t, const absl::Status& status) {
      raw->ended = true;
      raw->status = status;
    };
    auto issued = receiver_.Expect(std::move(request));
    CHECK_OK(issued.status());
    lease->descriptor = issued->Serialize();
    leases_.push_back(std::move(lease));
    return raw;
  }

  // Drives the receiver until `done()` or `timeout`; false on timeout.
  bool PumpUntil(const std::function<bool()>& done, absl::Duration timeout = absl::Seconds(60)) {
    const absl::Time deadline = absl::Now() + timeout;
    while (!done()) {
      if (absl::Now() >= deadline) return false;
      receiver_.Poll();
      receiver_.WaitForActivity(std::min(deadline, absl::Now() + absl::Milliseconds(1)));
    }
    return true;
  }

  // Continues a landed lease from `first_token` greedily on this engine;
  // returns the first token and `n - 1` more.
  std::vector<int32_t> Continue(Lease& lease, int32_t first_token, int n) {
    CHECK(lease.ended && lease.status.ok()) << lease.status;
    lease.table.Advance(lease.prompt_len);
    std::vector<int32_t> tokens = {first_token};
    while (static_cast<int>(tokens.size()) < n) {
      const BatchItem item{&lease.table, std::span<const int32_t>(&tokens.back(), 1), true};
      auto logits = engine_->Step({&item, 1});
      CHECK_OK(logits.status());
      tokens.push_back(Argmax(*logits));
    }
    return tokens;
  }

  void Release(Lease& lease) { engine_->Release(lease.table); }

  // The bytes of prompt block `block` of `lease` in this side's cache, every
  // layer in order.
  std::string BlockBytes(const Lease& lease, int block) {
    const KvLayout& layout = engine_->kv_layout();
    const auto* cache = static_cast<const char*>(engine_->kv_cache());
    std::string bytes;
    for (int l = 0; l < layout.n_layers; ++l) {
      const size_t offset =
          layout.BlockOffset(l, lease.table.blocks()[block]) * layout.element_bytes();
      bytes.append(cache + offset, layout.block_bytes());
    }
    return bytes;
  }

 private:
  std::unique_ptr<Engine> engine_;
  // Before the receiver, whose destructor may still end leases.
  std::deque<std::unique_ptr<Lease>> leases_;
  std::unique_ptr<kvtransfer::InProcTransport> transport_;
  kvtransfer::TransferReceiver receiver_;
  BlockTable filler_{16};
  kvtransfer::RegionId region_ = 0;
  uint64_t next_id_ = 1000;
};

}  // namespace tandem::prefill::testing

#endif  // TANDEM_TESTS_UNIT_PREFILL_WORKER_DECODE_SIDE_H_
