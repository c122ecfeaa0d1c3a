// Helpers for the decode worker tests: a small synthetic model, a stand-in
// prefill worker that computes a prompt on its own engine and ships its KV
// cache as a prefill worker does, and a harness around a decode loop (the
// sink and bounded waiting are in recording_sink.h).
#ifndef TANDEM_TESTS_UNIT_DECODE_WORKER_DECODE_TEST_UTIL_H_
#define TANDEM_TESTS_UNIT_DECODE_WORKER_DECODE_TEST_UTIL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/engine/engine.h"
#include "common/engine/generate.h"
#include "common/engine/logprobs.h"
#include "common/engine/sampler.h"
#include "common/model/synthetic.h"
#include "decode_worker/decode_loop.h"
#include "decode_worker/decode_types.h"
#include "kvtransfer/faulty_transport.h"
#include "kvtransfer/inproc_transport.h"
#include "kvtransfer/slices.h"
#include "kvtransfer/transfer_sender.h"
#include "kvtransfer/wire_format.h"
#include "tests/unit/decode_worker/recording_sink.h"

namespace tandem::decode::testing {

// SmallShape().vocab_size.
inline constexpr int kVocab = 101;

inline ModelConfig SmallShape() {
  return ModelConfig{.dim = 64,
                     .hidden_dim = 96,
                     .n_layers = 3,
                     .n_heads = 8,
                     .n_kv_heads = 4,
                     .vocab_size = 101,
                     .seq_len = 128,
                     .shared_classifier = true};
}

inline std::unique_ptr<Backend> OneThreadBackend() {
  auto backend = CpuBackend::Create(CpuBackendOptions{1});
  CHECK_OK(backend.status());
  return std::move(backend).value();
}

inline std::unique_ptr<Engine> MakeEngine(const ModelWeights& weights, EngineOptions options) {
  auto engine = Engine::Create(weights, OneThreadBackend(), options);
  CHECK_OK(engine.status());
  return std::move(engine).value();
}

// Tokens the single-stream engine path (Generate on `reference`)
// produces for `r`.
inline std::vector<int32_t> EngineTokens(Engine& reference, const Request& r) {
  GenerateRequest g;
  g.prompt = r.prompt;
  g.max_new_tokens = r.max_tokens;
  g.sampling = r.sampling;
  g.eos_ids = r.stop_token_ids;
  absl::StatusOr<GenerateResult> result = Generate(reference, g);
  CHECK_OK(result.status());
  return result->tokens;
}

inline std::vector<int32_t> RandomTokens(int n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& id : t) id = static_cast<int32_t>(rng() % vocab);
  return t;
}

// Plays the prefill worker: its own engine on the same weights and a
// TransferSender on the test's fabric. Driven by the calling thread only.
class FakePrefill {
 public:
  // `faults` are injected into what this side sends.
  FakePrefill(const ModelWeights& weights, std::shared_ptr<kvtransfer::InProcFabric> fabric,
              kvtransfer::FaultPlan faults = {})
      : engine_(MakeEngine(
            weights,
            EngineOptions{
                .block_size = 16, .num_blocks = 64, .max_batch_tokens = 256, .max_logit_rows = 1})),
        transport_(std::make_unique<kvtransfer::FaultyTransport>(
            kvtransfer::InProcTransport::Create(std::move(fabric)), std::move(faults),
            &Clock::Real())),
        sender_(std::make_unique<kvtransfer::TransferSender>(transport_.get(), &Clock::Real())) {
    region_ = sender_
                  ->RegisterMemory(engine_->kv_cache(), engine_->kv_cache_bytes(),
                                   kvtransfer::MemoryKind::kHost)
                  .value();
    // Holds some blocks so that the two sides' block ids differ.
    offset_ = engine_->NewSequence();
    CHECK_OK(offset_.Reserve(40, engine_->block_pool()));
  }
  ~FakePrefill() {
    sender_.reset();
    engine_->Release(offset_);
  }

  // A sequence holding `blocks`, layer by layer, as a prefill worker sends it.
  std::vector<std::vector<kvtransfer::Slice>> LayerSlices(std::span<const int32_t> blocks) const {
    const KvLayout& layout = engine_->kv_layout();
    return kvtransfer::PagedKvSlices(region_, layout.n_layers, layout.layer_bytes(),
                                     layout.block_bytes(), blocks);
  }

  // Computes `prompt`, sends each layer's KV as soon as it is written, and
  // returns the first token (sampled as a prefill worker does: a fresh
  // Sampler of the request's parameters) once the receiver confirmed the
  // whole transfer. `abort_after_layer` >= 0 cancels the transfer after that
  // layer.
  absl::StatusOr<int32_t> Prefill(const std::vector<int32_t>& prompt, const std::string& descriptor,
                                  int abort_after_layer = -1, const SamplingParams& sampling = {}) {
    ASSIGN_OR_RETURN(std::vector<int32_t> first,
                     PrefillChoices(prompt, descriptor, abort_after_layer, sampling, 1, {}));
    return first[0];
  }

  // Prefill, sampling one first token per choice as the prefill worker
  // does: choice i with seed ChoiceSeed(seed, i), fed the prompt and the
  // stop ids.
  absl::StatusOr<std::vector<int32_t>> PrefillChoices(const std::vector<int32_t>& prompt,
                                                      const std::string& descriptor,
                                                      int abort_after_layer,
                                                      const SamplingParams& sampling, int n,
                                                      const std::vector<int32_t>& stop_ids) {
    ASSIGN_OR_RETURN(std::unique_ptr<Sent> sent,
                     Send(prompt, descriptor, abort_after_layer, sampling, n, stop_ids));
    return Finish(*sent);
  }

  // A prefill whose KV has been posted and whose transfer may not have
  // ended yet; its source blocks are held until Finish.
  struct Sent {
    BlockTable table{16};
    uint64_t id = 0;
    std::optional<absl::Status> done;
    absl::StatusOr<std::vector<int32_t>> first_tokens = std::vector<int32_t>();
    // Per choice: the numbers its sampler drew for the first token.
    std::vector<uint64_t> draws;
  };

  // The first half of PrefillChoices: computes `prompt`, posts every
  // layer's KV as it is written and samples the first tokens, without
  // waiting for the receiver.
  absl::StatusOr<std::unique_ptr<Sent>> Send(const std::vector<int32_t>& prompt,
                                             const std::string& descriptor, int abort_after_layer,
                                             const SamplingParams& sampling, int n,
                                             const std::vector<int32_t>& stop_ids) {
    auto sent = std::make_unique<Sent>();
    BlockTable& table = sent->table;
    absl::Cleanup release = [&] { engine_->Release(table); };
    RETURN_IF_ERROR(table.Reserve(static_cast<int>(prompt.size()), engine_->block_pool()));
    // The receiver holds the blocks before the lease's first one already.
    ASSIGN_OR_RETURN(kvtransfer::TransferLease lease, kvtransfer::TransferLease::Parse(descriptor));
    if (lease.first_block > table.blocks().size()) {
      return absl::InvalidArgumentError("test prefill: lease starts past the prompt");
    }
    Sent* s = sent.get();
    ASSIGN_OR_RETURN(sent->id,
                     sender_->Start(kvtransfer::SendRequest{
                         .descriptor = descriptor,
                         .layers = LayerSlices(table.blocks().subspan(lease.first_block)),
                         .deadline = absl::Now() + kWait,
                         .done = [s](uint64_t, const absl::Status& status) { s->done = status; }}));
    std::move(release).Cancel();
    const uint64_t id = sent->id;
    const BatchItem item{&table, prompt, true};
    absl::StatusOr<std::vector<float>> logits = engine_->Step({&item, 1}, [&](int layer) {
      if (abort_after_layer >= 0 && layer > abort_after_layer) return;
      (void)sender_->MarkLayerReady(id, layer);
      if (layer == abort_after_layer) (void)sender_->Cancel(id);
    });
    if (!logits.ok()) {
      sent->first_tokens = logits.status();
      return sent;
    }
    std::vector<int32_t> first;
    for (int i = 0; i < n; ++i) {
      SamplingParams params = sampling;
      params.seed = ChoiceSeed(sampling.seed, i);
      Sampler sampler(params, prompt, stop_ids);
      first.push_back(sampler.Sample(*logits));
      sent->draws.push_back(sampler.draws());
    }
    last_draws_ = sent->draws;
    sent->first_tokens = std::move(first);
    return sent;
  }

  // Polls the sender `polls` times without waiting; true once the transfer
  // of `sent` has ended.
  bool PollEnded(Sent& sent, int polls) {
    for (int i = 0; i < polls && !sent.done.has_value(); ++i) sender_->Poll();
    return sent.done.has_value();
  }

  // The second half: waits for the transfer's end (the source blocks stay
  // untouched until then), frees the source blocks and returns the first
  // tokens once the receiver confirmed the whole transfer. `on_poll` (if
  // set) runs after each poll of the sender: to move a fake clock of the
  // receiving side, say.
  absl::StatusOr<std::vector<int32_t>> Finish(Sent& sent,
                                              const std::function<void()>& on_poll = nullptr) {
    const absl::Time deadline = absl::Now() + kWait;
    while (!sent.done.has_value() && absl::Now() < deadline) {
      sender_->Poll();
      if (on_poll) on_poll();
      if (!sent.done.has_value()) sender_->WaitForActivity(absl::Now() + absl::Milliseconds(2));
    }
    if (!sent.done.has_value()) {
      // The sender may still read the blocks: keep them out of the pool.
      return absl::DeadlineExceededError("test prefill: transfer hung");
    }
    engine_->Release(sent.table);
    RETURN_IF_ERROR(*sent.done);
    return sent.first_tokens;
  }

  // The draw counts of the last prefill sent (for Start).
  const std::vector<uint64_t>& last_draws() const { return last_draws_; }

  // Messages so far that left a transfer unable to complete: dropped, or
  // held back for a reorder that may never come. Such a transfer ends only
  // when the receiver's lease runs out.
  uint64_t stalling_faults() const {
    return transport_->injected(kvtransfer::Fault::Kind::kDrop) +
           transport_->injected(kvtransfer::Fault::Kind::kReorder);
  }

 private:
  std::vector<uint64_t> last_draws_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<kvtransfer::FaultyTransport> transport_;
  std::unique_ptr<kvtransfer::TransferSender> sender_;
  kvtransfer::RegionId region_ = 0;
  BlockTable offset_{16};
};

// What a DecodeHarness test may put in place of the defaults.
struct HarnessSetup {
  ModelConfig shape = SmallShape();
  // The decode loop's backend; null: OneThreadBackend().
  std::unique_ptr<Backend> backend;
  // Wraps the decode loop's transport; null: none.
  std::function<std::unique_ptr<kvtransfer::KvTransport>(std::unique_ptr<kvtransfer::KvTransport>)>
      wrap_transport;
};

// A decode loop over an in-process transport, a stand-in prefill worker on
// the same fabric, and a reference engine for expected tokens.
class DecodeHarness {
 public:
  explicit DecodeHarness(DecodeLoopOptions options = {}, kvtransfer::FaultPlan prefill_faults = {},
                         HarnessSetup setup = HarnessSetup()) {
    constexpr uint64_t model_seed = 7;
    weights_ = MakeSyntheticModel(setup.shape, model_seed).value();
    fabric_ = kvtransfer::InProcFabric::Create();
    transport_ = kvtransfer::InProcTransport::Create(fabric_);
    if (setup.wrap_transport) transport_ = setup.wrap_transport(std::move(transport_));
    if (options.model_name.empty()) options.model_name = "synthetic-small";
    std::unique_ptr<Backend> backend =
        setup.backend != nullptr ? std::move(setup.backend) : OneThreadBackend();
    auto loop = DecodeLoop::Create(*weights_, std::move(backend), transport_.get(), options);
    CHECK_OK(loop.status());
    loop_ = std::move(loop).value();
    prefill_ = std::make_unique<FakePrefill>(*weights_, fabric_, std::move(prefill_faults));
    reference_ = MakeEngine(*weights_, EngineOptions{.num_blocks = 16, .max_batch_tokens = 128});
  }
  ~DecodeHarness() {
    // The loop stops driving its transport before the transport goes.
    loop_.reset();
  }

  DecodeLoop& loop() { return *loop_; }
  FakePrefill& prefill() { return *prefill_; }
  const ModelConfig& config() const { return weights_->config; }
  const ModelWeights& weights() const { return *weights_; }

  // Tokens the single-stream engine path generates for the same request.
  std::vector<int32_t> Expected(const Request& r) { return EngineTokens(*reference_, r); }

  bool AllBlocksFree(absl::Duration timeout = kWait) {
    return WaitFor(
        [&] {
          const LoopStats s = loop_->Stats();
          return s.kv_blocks_free == s.kv_blocks_total && s.running == 0 && s.waiting == 0;
        },
        timeout);
  }

  // Runs a remote-prefill request to its end: reserve, prefill, Start.
  // Returns choice 0's first token followed by its streamed ones.
  absl::StatusOr<std::vector<int32_t>> RunRemote(const Request& r,
                                                 const std::shared_ptr<RecordingSink>& sink) {
    ASSIGN_OR_RETURN(std::vector<std::vector<int32_t>> all, RunRemoteChoices(r, sink));
    return all[0];
  }

  // The same for every choice: each one's first token and streamed ones
  // (a first token that is a stop id is left out, as it ends the choice).
  absl::StatusOr<std::vector<std::vector<int32_t>>> RunRemoteChoices(
      const Request& r, const std::shared_ptr<RecordingSink>& sink) {
    RETURN_IF_ERROR(loop_->Submit(r, sink).status());
    if (!sink->WaitReserved()) {
      return absl::InternalError(absl::StrCat("no reservation: ", sink->status().ToString()));
    }
    ASSIGN_OR_RETURN(std::vector<int32_t> first,
                     prefill_->PrefillChoices(r.prompt, sink->descriptor(), -1, r.sampling, r.n,
                                              r.stop_token_ids));
    StartResult start;
    loop_->Start(r.request_id, sink->generation(), first[0],
                 std::vector<int32_t>(first.begin() + 1, first.end()), start.Callback(),
                 prefill_->last_draws());
    RETURN_IF_ERROR(start.Wait());
    if (!sink->WaitEnded()) return absl::DeadlineExceededError("test: stream did not end");
    RETURN_IF_ERROR(sink->status());
    std::vector<std::vector<int32_t>> all;
    for (int i = 0; i < r.n; ++i) {
      std::vector<int32_t> tokens;
      if (sink->finished(i)->completion_tokens > 0) tokens.push_back(first[i]);
      for (int32_t t : sink->tokens(i)) tokens.push_back(t);
      all.push_back(std::move(tokens));
    }
    return all;
  }

  // Runs a local-prefill request to its end; every choice's tokens.
  absl::StatusOr<std::vector<std::vector<int32_t>>> RunLocalChoices(
      const Request& r, const std::shared_ptr<RecordingSink>& sink) {
    RETURN_IF_ERROR(loop_->Submit(r, sink).status());
    if (!sink->WaitEnded()) return absl::DeadlineExceededError("test: stream did not end");
    RETURN_IF_ERROR(sink->status());
    std::vector<std::vector<int32_t>> all;
    for (int i = 0; i < r.n; ++i) all.push_back(sink->tokens(i));
    return all;
  }

 private:
  std::unique_ptr<ModelWeights> weights_;
  std::shared_ptr<kvtransfer::InProcFabric> fabric_;
  std::unique_ptr<kvtransfer::KvTransport> transport_;
  std::unique_ptr<DecodeLoop> loop_;
  std::unique_ptr<FakePrefill> prefill_;
  std::unique_ptr<Engine> reference_;
};

// Returns once `loop` has handled every Submit and Start sent before the
// call and has run a whole round begun after it (so has checked its
// deadlines against the clock's time at the call). A Start for an unknown
// request is answered at once, after the commands queued before it: two in
// turn, the second handled in a later round than the first.
inline bool LoopCaughtUp(DecodeLoop& loop) {
  for (int i = 0; i < 2; ++i) {
    StartResult probe;
    loop.Start("no-such-request", 0, 0, probe.Callback());
    if (!absl::IsNotFound(probe.Wait())) return false;
  }
  return true;
}

inline Request RemoteRequest(std::string id, std::vector<int32_t> prompt, int max_tokens) {
  Request r;
  r.request_id = std::move(id);
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  return r;
}

inline Request LocalRequest(std::string id, std::vector<int32_t> prompt, int max_tokens) {
  Request r = RemoteRequest(std::move(id), std::move(prompt), max_tokens);
  r.local_prefill = true;
  return r;
}

}  // namespace tandem::decode::testing

#endif  // TANDEM_TESTS_UNIT_DECODE_WORKER_DECODE_TEST_UTIL_H_
