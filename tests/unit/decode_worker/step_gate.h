// Test doubles that let a test see, and hold, the decode loop between and
// inside engine steps: a Backend that logs each step's start (with its
// rows) and each layer's K/V write, and can hold every step at its start
// until the test lets it go; and a KvTransport that logs the completion
// acknowledgements its receiver sends. Both write into one StepLog, so a
// test can tell what happened inside which step.
#ifndef TANDEM_TESTS_UNIT_DECODE_WORKER_STEP_GATE_H_
#define TANDEM_TESTS_UNIT_DECODE_WORKER_STEP_GATE_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/compute/backend.h"
#include "kvtransfer/kv_transport.h"
#include "kvtransfer/wire_format.h"
#include "tests/testing/forwarding_backend.h"

namespace tandem::decode::testing {

// What happened, in order. Thread-safe.
class StepLog {
 public:
  enum class Kind {
    kStep,  // An engine step started; value: its rows (tokens).
    kKv,    // A layer's K/V were written; value: the layer.
    kAck,   // The receiver told a sender its transfer completed.
  };
  struct Entry {
    Kind kind;
    int value;
  };

  void Add(Kind kind, int value) {
    absl::MutexLock lock(&mu_);
    entries_.push_back(Entry{kind, value});
  }
  std::vector<Entry> entries() const {
    absl::MutexLock lock(&mu_);
    return entries_;
  }
  // Rows of every step so far, in order.
  std::vector<int> step_rows() const {
    std::vector<int> rows;
    for (const Entry& e : entries()) {
      if (e.kind == Kind::kStep) rows.push_back(e.value);
    }
    return rows;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
};

// The CPU backend (or any other) with every step's start logged, and held
// while the gate is armed until the test allows it.
class GatedBackend final : public tandem::testing::ForwardingBackend {
 public:
  GatedBackend(std::unique_ptr<Backend> inner, StepLog* log)
      : ForwardingBackend(std::move(inner)), log_(log) {}

  // From now on each step waits at its start for Allow().
  void Arm() {
    absl::MutexLock lock(&mu_);
    armed_ = true;
    allowed_ = started_;
  }
  // Steps run freely again.
  void Disarm() {
    absl::MutexLock lock(&mu_);
    armed_ = false;
  }
  // Lets the step held at its start (or the next one to start) run.
  void Allow() {
    absl::MutexLock lock(&mu_);
    ++allowed_;
  }
  // Steps started since construction (the one held included).
  int started() const {
    absl::MutexLock lock(&mu_);
    return started_;
  }
  // Waits until step number `step` (1-based, since construction) is held at
  // its start; false after `timeout`.
  bool WaitHeld(int step, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto held = [this, step]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return started_ == step && armed_ && allowed_ < started_;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&held), timeout);
  }

  std::string_view name() const override { return "gated"; }
  // The first thing every forward pass does.
  void Embed(MatrixRef t, std::span<const int32_t> ids, int dim, float* out) override {
    log_->Add(StepLog::Kind::kStep, static_cast<int>(ids.size()));
    {
      absl::MutexLock lock(&mu_);
      const int me = ++started_;
      auto go = [this, me]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !armed_ || allowed_ >= me; };
      mu_.Await(absl::Condition(&go));
    }
    ForwardingBackend::Embed(t, ids, dim, out);
  }
  void WriteKv(const float* k, int ks, const float* v, int vs, std::span<const AttentionRow> rows,
               int layer, const KvLayout& layout, void* cache) override {
    ForwardingBackend::WriteKv(k, ks, v, vs, rows, layer, layout, cache);
    log_->Add(StepLog::Kind::kKv, layer);
  }

 private:
  StepLog* const log_;
  mutable absl::Mutex mu_;
  bool armed_ ABSL_GUARDED_BY(mu_) = false;
  int started_ ABSL_GUARDED_BY(mu_) = 0;
  int allowed_ ABSL_GUARDED_BY(mu_) = 0;
};

// A transport that logs every kComplete it sends.
class AckLoggingTransport final : public kvtransfer::KvTransport {
 public:
  AckLoggingTransport(std::unique_ptr<kvtransfer::KvTransport> inner, StepLog* log)
      : inner_(std::move(inner)), log_(log) {}

  std::string_view name() const override { return inner_->name(); }
  absl::StatusOr<kvtransfer::RegionId> RegisterMemory(void* base, size_t length,
                                                      kvtransfer::MemoryKind kind) override {
    return inner_->RegisterMemory(base, length, kind);
  }
  absl::Status DeregisterMemory(kvtransfer::RegionId region) override {
    return inner_->DeregisterMemory(region);
  }
  std::string LocalAddress() const override { return inner_->LocalAddress(); }
  absl::StatusOr<kvtransfer::PeerId> Connect(std::string_view address) override {
    return inner_->Connect(address);
  }
  void Disconnect(kvtransfer::PeerId peer) override { inner_->Disconnect(peer); }
  absl::StatusOr<kvtransfer::SendId> PostSend(kvtransfer::PeerId peer, std::string_view header,
                                              std::span<const kvtransfer::Slice> payload) override {
    absl::StatusOr<kvtransfer::MessageHeader> h = kvtransfer::MessageHeader::Parse(header);
    if (h.ok() && h->type == kvtransfer::MessageType::kComplete) {
      log_->Add(StepLog::Kind::kAck, 0);
    }
    return inner_->PostSend(peer, header, payload);
  }
  absl::Status Accept(kvtransfer::IncomingId incoming,
                      std::span<const kvtransfer::Slice> destination) override {
    return inner_->Accept(incoming, destination);
  }
  void Discard(kvtransfer::IncomingId incoming) override { inner_->Discard(incoming); }
  void Cancel(kvtransfer::SendId send) override { inner_->Cancel(send); }
  void Poll(std::vector<kvtransfer::TransportEvent>& events) override { inner_->Poll(events); }
  void WaitForActivity(absl::Time deadline) override { inner_->WaitForActivity(deadline); }

 private:
  const std::unique_ptr<kvtransfer::KvTransport> inner_;
  StepLog* const log_;
};

}  // namespace tandem::decode::testing

#endif  // TANDEM_TESTS_UNIT_DECODE_WORKER_STEP_GATE_H_
