#include "decode_worker/decode_core.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/worker/worker_engine.h"
#include "common/worker/worker_health.h"

namespace tandem::decode {

namespace {

// How long shutdown waits for the transport to let go of cancelled leases'
// destinations before the KV cache is freed.
constexpr absl::Duration kShutdownGrace = absl::Seconds(5);

}  // namespace

DecodeState::DecodeState(std::unique_ptr<Engine> engine_in, std::unique_ptr<KvStaging> staging_in,
                         kvtransfer::KvTransport* transport_in, DecodeLoopOptions options_in)
    : options(std::move(options_in)),
      clock(options.clock != nullptr ? options.clock : &Clock::Real()),
      config(engine_in->config()),
      salt(BlockHashSalt(options.weights_fingerprint, DTypeName(engine_in->kv_layout().dtype),
                         engine_in->kv_layout().block_size)),
      engine(std::move(engine_in)),
      executor(options.make_executor ? options.make_executor(*engine) : nullptr),
      staging(std::move(staging_in)),
      copier(staging != nullptr ? engine->backend().kv_copier() : nullptr),
      transport(transport_in),
      receiver(std::make_unique<kvtransfer::TransferReceiver>(transport, clock, options.receiver)) {
}

absl::StatusOr<std::unique_ptr<DecodeCore>> DecodeCore::Create(
    const ModelWeights& weights, std::unique_ptr<Backend> backend,
    kvtransfer::KvTransport* transport, DecodeLoopOptions options,
    std::function<void(int n)> on_released) {
  if (transport == nullptr) return absl::InvalidArgumentError("a KV transport is required");
  if (options.block_size <= 0 || options.kv_blocks < 0) {
    return absl::InvalidArgumentError("block_size must be > 0 and kv_blocks >= 0");
  }
  if (options.max_sequences <= 0 || options.max_batch_tokens < options.max_sequences) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_sequences (", options.max_sequences, ") must be > 0 and at most max_batch_tokens (",
        options.max_batch_tokens, "): every running sequence steps one token per batch"));
  }
  if (options.schedule_policy == SchedulePolicyKind::kChunked &&
      (options.prefill_chunk_tokens < options.max_sequences ||
       options.prefill_chunk_tokens > options.max_batch_tokens)) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefill_chunk_tokens (", options.prefill_chunk_tokens,
                     ") must be at least max_sequences (", options.max_sequences,
                     ") and at most max_batch_tokens (", options.max_batch_tokens,
                     ") with the chunked schedule policy"));
  }
  if (options.kv_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("kv_timeout must be positive");
  }
  ASSIGN_OR_RETURN(WorkerEngine we,
                   CreateWorkerEngine(weights, std::move(backend),
                                      {.role = "decode",
                                       .block_size = options.block_size,
                                       .kv_dtype = options.kv_dtype,
                                       .kv_blocks = options.kv_blocks,
                                       .gpu_memory_fraction = options.gpu_memory_fraction,
                                       .max_batch_tokens = options.max_batch_tokens,
                                       // At most one row of logits per held sequence.
                                       .max_logit_rows = options.max_sequences,
                                       .kv_staging_blocks = options.kv_staging_blocks,
                                       .transport_name = transport->name(),
                                       .transport_device_memory = options.transport_device_memory,
                                       .warm_up_tokens = options.warm_up_tokens}));
  const int pool_blocks = we.engine->block_pool().num_blocks();
  if (options.kv_watermark_blocks == -1) {
    options.kv_watermark_blocks = std::max(1, pool_blocks / 50);
  }
  if (options.kv_watermark_blocks < 0 || options.kv_watermark_blocks >= pool_blocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv_watermark_blocks (", options.kv_watermark_blocks,
        ") must be -1 (2% of the pool) or in [0, ", pool_blocks, "), the KV pool's blocks"));
  }
  if (options.weights_fingerprint.empty()) options.weights_fingerprint = weights.Fingerprint();
  void* const memory = we.transport_memory();
  const size_t bytes = we.transport_bytes();
  std::unique_ptr<DecodeCore> core(
      new DecodeCore(std::move(we.engine), std::move(we.staging), transport, std::move(options)));
  core->state_.on_released = std::move(on_released);
  // The transport writes host memory only: the staging when there is one.
  ASSIGN_OR_RETURN(core->state_.kv_region, core->state_.receiver->RegisterMemory(
                                               memory, bytes, kvtransfer::MemoryKind::kHost));
  DecodeState& s = core->state_;
  if (s.options.handoff_transport != nullptr && s.staging == nullptr) {
    s.sender = std::make_unique<kvtransfer::TransferSender>(s.options.handoff_transport, s.clock);
    ASSIGN_OR_RETURN(s.send_region,
                     s.sender->RegisterMemory(memory, bytes, kvtransfer::MemoryKind::kHost));
  }
  return core;
}

DecodeCore::DecodeCore(std::unique_ptr<Engine> engine, std::unique_ptr<KvStaging> staging,
                       kvtransfer::KvTransport* transport, DecodeLoopOptions options)
    : state_(std::move(engine), std::move(staging), transport, std::move(options)),
      emitter_(state_),
      preemption_(state_, emitter_),
      remote_(state_, emitter_),
      handoffs_(state_, emitter_),
      admission_(state_, emitter_, remote_, preemption_),
      stepper_(state_, emitter_, preemption_, remote_) {}

DecodeCore::~DecodeCore() {
  if (state_.sender != nullptr) {
    if (state_.sender->idle()) {
      (void)state_.sender->DeregisterMemory(state_.send_region);
    } else {
      LOG(ERROR) << "decode core: " << state_.sender->pending()
                 << " handoffs still open at shutdown";
    }
    state_.sender.reset();
  }
  kvtransfer::TransferReceiver& receiver = *state_.receiver;
  if (receiver.idle()) {
    (void)receiver.DeregisterMemory(state_.kv_region);
  } else {
    // The transport may still write into these destinations: leave the
    // region registered (the transport outlives us) rather than race it.
    LOG(ERROR) << "decode core: " << receiver.pending() << " KV transfers still open at shutdown";
  }
  // Now, while the requests its done callbacks name still exist.
  state_.receiver.reset();
}

void DecodeCore::Cancel(Ticket ticket) {
  Sequence* seq = state_.Find(ticket);
  if (seq == nullptr || seq->ended()) return;
  emitter_.Fail(*seq, absl::CancelledError(absl::StrCat("request '", seq->request.request_id,
                                                        "' cancelled by the client")));
}

bool DecodeCore::RunRound() {
  state_.receiver->Poll();
  handoffs_.Poll();
  remote_.PollLandings();
  ExpireDeadlines();
  // The running sequences take their next blocks before waiting ones are
  // admitted into what is left.
  preemption_.GrowRunning();
  admission_.AdmitWaiting();
  const bool stepped = stepper_.StepOnce();
  if (state_.draining) OfferMoves();
  return stepped;
}

void DecodeCore::OfferMoves() {
  for (auto& [ticket, seq] : state_.sequences) {
    if (seq->ended() || !seq->request.movable || seq->move_offered) continue;
    // Past its first token: the caller resumes from the tokens it has.
    const bool past_first = seq->state == Sequence::State::kRunning ||
                            seq->state == Sequence::State::kPreempted ||
                            seq->state == Sequence::State::kRecomputing;
    if (!past_first || std::any_of(seq->choices.begin(), seq->choices.end(), [](const Choice& c) {
          return !c.finished && c.generated == 0;
        })) {
      continue;
    }
    seq->move_offered = true;
    seq->sink->OnMoving(state_.sender != nullptr && seq->n() == 1 &&
                        seq->state == Sequence::State::kRunning);
  }
}

void DecodeCore::ExpireDeadlines() {
  const absl::Time now = state_.clock->Now();
  std::vector<Sequence*> expired;
  for (auto& [ticket, seq] : state_.sequences) {
    if (seq->ended()) continue;
    // An open lease expires in the receiver (which tells the sender); a
    // complete one still needs its Start by the lease deadline.
    const bool reservation_expired = seq->state == Sequence::State::kKvReady &&
                                     !seq->first_tokens.has_value() && now >= seq->lease_deadline;
    if (reservation_expired || now >= seq->request.deadline) expired.push_back(seq.get());
  }
  for (Sequence* seq : expired) {
    if (now >= seq->request.deadline) {
      emitter_.Fail(*seq, absl::DeadlineExceededError(absl::StrCat(
                              "request '", seq->request.request_id, "': deadline exceeded")));
    } else {
      emitter_.Fail(*seq, absl::DeadlineExceededError(
                              absl::StrCat("request '", seq->request.request_id,
                                           "': no Start arrived within the KV timeout (",
                                           absl::FormatDuration(state_.options.kv_timeout), ")")));
    }
  }
}

void DecodeCore::Shutdown(const absl::Status& status) {
  std::vector<Sequence*> live;
  for (auto& [ticket, seq] : state_.sequences) live.push_back(seq.get());
  for (Sequence* seq : live) emitter_.Fail(*seq, status);
  kvtransfer::TransferReceiver& receiver = *state_.receiver;
  const absl::Time deadline = absl::Now() + kShutdownGrace;
  // Cancelled handoffs let go of their blocks once their sends end.
  while (!handoffs_.idle() && absl::Now() < deadline) {
    handoffs_.Poll();
    if (!handoffs_.idle()) state_.sender->WaitForActivity(absl::Now() + kTransportWait);
  }
  while (!receiver.idle() && absl::Now() < deadline) {
    receiver.Poll();
    if (!receiver.idle()) receiver.WaitForActivity(absl::Now() + kTransportWait);
  }
  // Copies out of the staging take a moment; the blocks wait for them.
  while (remote_.landings_pending() && absl::Now() < deadline) {
    remote_.PollLandings();
    if (remote_.landings_pending()) absl::SleepFor(kCopyPoll);
  }
  if (remote_.landings_pending()) {
    LOG(ERROR) << "decode core: KV copies out of the staging did not finish by shutdown";
  }
}

LoopStats DecodeCore::Snapshot() const {
  LoopStats s;
  s.model = state_.options.model_name;
  s.weights_fingerprint = state_.options.weights_fingerprint;
  s.model_shape = state_.config.ShapeString();
  s.kv_dtype = std::string(DTypeName(state_.engine->kv_layout().dtype));
  s.vocab_size = state_.config.vocab_size;
  s.max_context = state_.config.seq_len;
  s.block_size = state_.engine->kv_layout().block_size;
  s.kv_blocks_total = state_.engine->block_pool().num_blocks();
  s.kv_blocks_free = state_.engine->block_pool().num_free();
  s.kv_blocks_cached = state_.engine->block_pool().num_cached();
  s.prefix_cache_evicted_blocks = state_.engine->block_pool().evictions();
  AddEngineStats(*state_.engine, s);
  s.prefix_cache_queried_tokens = state_.cache_queried_tokens;
  s.prefix_cache_hit_tokens = state_.cache_hit_tokens;
  s.preemptions = state_.preemptions;
  for (const auto& [ticket, seq] : state_.sequences) {
    if (seq->ended()) continue;
    for (const Choice& choice : seq->choices) {
      if (choice.running) {
        ++s.running;
      } else if (!choice.finished) {
        ++s.waiting;
      }
    }
  }
  const kvtransfer::ReceiverStats& rx = state_.receiver->stats();
  s.kv_transfers = rx.completed;
  s.kv_transfer_bytes = rx.accepted_bytes;
  s.kv_transfers_failed = rx.failed - rx.cancelled;
  s.requests_failed = state_.failed;  // DecodeLoop::Stats adds the refusals.
  return s;
}

}  // namespace tandem::decode
