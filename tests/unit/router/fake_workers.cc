#include "tests/unit/router/fake_workers.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/stream_writer.h"

namespace tandem::router::testing {

v1::TokenLogprob FakeLogprob(int32_t token, int alternatives) {
  v1::TokenLogprob l;
  l.set_token_id(token);
  l.set_logprob(-0.25f * static_cast<float>(token % 8));
  for (int k = 0; k < alternatives; ++k) {
    v1::TopLogprob* t = l.add_top();
    t->set_token_id((token + k) % kFakeVocab);
    t->set_logprob(-0.5f * static_cast<float>(k));
  }
  return l;
}

namespace {

constexpr int kBlocks = 64;

v1::WorkerStats Stats(const char* role, const FakeModel& model, int vocab_size, bool draining,
                      int running) {
  v1::WorkerStats s;
  s.set_role(role);
  s.set_model(model.name);
  s.set_weights_fingerprint(model.weights_fingerprint);
  s.set_model_shape(model.model_shape);
  s.set_kv_dtype(model.kv_dtype);
  s.set_vocab_size(model.vocab_size > 0 ? model.vocab_size : vocab_size);
  s.set_max_context(kFakeMaxContext);
  s.set_block_size(model.block_size);
  s.set_kv_blocks_total(kBlocks);
  s.set_kv_blocks_free(kBlocks);
  s.set_running(running);
  s.set_draining(draining);
  return s;
}

grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* ctx, grpc::Status status) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(std::move(status));
  return reactor;
}

}  // namespace

// ---------------------------------------------------------------------------
// FakeDecodeWorker

struct FakeDecodeWorker::Stream {
  v1::DecodeRequest request;
  uint64_t generation = 0;
  std::shared_ptr<rpc::StreamWriter<v1::DecodeEvent>> writer;
  absl::Mutex mu;
  bool started ABSL_GUARDED_BY(mu) = false;
  bool cancelled ABSL_GUARDED_BY(mu) = false;
};

FakeDecodeWorker::FakeDecodeWorker(int vocab_size) : vocab_size_(vocab_size) {}

FakeDecodeWorker::~FakeDecodeWorker() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
}

void FakeDecodeWorker::SetBehaviour(DecodeBehaviour b) {
  absl::MutexLock lock(&mu_);
  behaviour_ = std::move(b);
}

void FakeDecodeWorker::SetDraining(bool draining) {
  absl::MutexLock lock(&mu_);
  draining_ = draining;
}

void FakeDecodeWorker::SetModel(FakeModel model) {
  absl::MutexLock lock(&mu_);
  model_ = std::move(model);
}

grpc::ServerWriteReactor<v1::DecodeEvent>* FakeDecodeWorker::Generate(
    grpc::CallbackServerContext*, const v1::DecodeRequest* request) {
  auto [reactor, writer] = rpc::StreamWriter<v1::DecodeEvent>::Create();
  absl::MutexLock lock(&mu_);
  requests_.push_back(*request);
  if (!behaviour_.refuse.ok() || draining_) {
    writer->Finish(
        rpc::ToGrpc(draining_ ? absl::UnavailableError("worker is draining") : behaviour_.refuse));
    return reactor;
  }
  if (!request->local_prefill() && behaviour_.fail_transfers > 0) {
    --behaviour_.fail_transfers;
    v1::DecodeEvent event;
    event.mutable_reserved()->set_kv_descriptor(absl::StrCat("kv:", request->request_id()));
    event.mutable_reserved()->set_generation(next_generation_++);
    writer->Write(std::move(event));
    writer->Finish(
        grpc::Status(behaviour_.transfer_failure,
                     absl::StrCat("request ", request->request_id(), ": the KV transfer failed")));
    return reactor;
  }
  auto stream = std::make_shared<Stream>();
  stream->request = *request;
  stream->generation = next_generation_++;
  stream->writer = writer;
  streams_.push_back(stream);
  ++open_streams_;
  writer->OnCancel([this, stream] {
    {
      absl::MutexLock l(&stream->mu);
      stream->cancelled = true;
    }
    absl::MutexLock l(&mu_);
    ++cancelled_;
  });
  if (!request->local_prefill() && !behaviour_.hold_reservation) {
    generations_.push_back(stream->generation);
    v1::DecodeEvent event;
    event.mutable_reserved()->set_kv_descriptor(absl::StrCat("kv:", request->request_id()));
    event.mutable_reserved()->set_generation(stream->generation);
    writer->Write(std::move(event));
  }
  threads_.emplace_back([this, stream, b = behaviour_] { RunStream(stream, b); });
  return reactor;
}

void FakeDecodeWorker::RunStream(std::shared_ptr<Stream> stream, DecodeBehaviour b) {
  auto done = [this] {
    absl::MutexLock lock(&mu_);
    --open_streams_;
  };
  auto wait_cancelled = [&stream] {
    absl::MutexLock lock(&stream->mu);
    stream->mu.AwaitWithTimeout(absl::Condition(&stream->cancelled), absl::Seconds(30));
  };
  const v1::DecodeRequest& request = stream->request;
  int generated = 0;
  if (!request.local_prefill()) {
    absl::MutexLock lock(&stream->mu);
    auto ready = [&stream]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(stream->mu) {
      return stream->started || stream->cancelled;
    };
    stream->mu.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(30));
    if (!stream->started) {
      stream->writer->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "never started"));
      done();
      return;
    }
    generated = 1;  // The first token came from prefill.
  }
  if (request.local_prefill() && request.prompt_logprobs()) {
    v1::DecodeEvent event;
    for (int i = 1; i < request.prompt_size(); ++i) {
      *event.mutable_prompt_logprobs()->add_logprobs() =
          FakeLogprob(request.prompt(i), request.has_logprobs() ? request.logprobs() : 0);
    }
    if (!stream->writer->Write(std::move(event))) {
      stream->writer->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "client gone"));
      done();
      return;
    }
  }
  const int first_generated = generated;
  const int n = std::max(1, request.n());
  for (int choice = 0; choice < n; ++choice) {
    generated = first_generated;
    // A migrated request: the choice's tokens so far came from elsewhere,
    // the first of them (as if) from a prefill worker.
    int skip = 0;
    if (choice < request.resume_size()) {
      if (request.resume(choice).finished()) continue;
      generated = request.resume(choice).tokens_size();
      skip = std::max(0, generated - 1);
    }
    v1::DecodeEvent pending;
    auto flush = [&] {
      if (pending.tokens().ids_size() == 0) return true;
      pending.mutable_tokens()->set_index(choice);
      const bool ok = stream->writer->Write(std::move(pending));
      pending.Clear();
      return ok;
    };
    v1::FinishReason reason = v1::FINISH_REASON_LENGTH;
    for (int i = 0; generated < request.max_tokens(); ++i) {
      if (b.fail_after >= 0 && i == b.fail_after) {
        flush();
        stream->writer->Finish(
            grpc::Status(grpc::StatusCode::UNAVAILABLE, "fake decode worker crashed"));
        done();
        return;
      }
      if (b.hold_after >= 0 && i == b.hold_after) {
        flush();
        wait_cancelled();
        stream->writer->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "held until cancelled"));
        done();
        return;
      }
      if (b.moving_after >= 0 && i == b.moving_after && choice == 0 && request.movable()) {
        flush();
        v1::DecodeEvent moving;
        moving.mutable_moving()->set_ships_kv(b.ships_kv);
        if (!stream->writer->Write(std::move(moving))) break;
      }
      if (b.token_interval > absl::ZeroDuration()) absl::SleepFor(b.token_interval);
      // Choice c follows the script c tokens further on.
      const int32_t token = b.script[(i + skip + choice) % b.script.size()];
      if (std::find(request.stop_token_ids().begin(), request.stop_token_ids().end(), token) !=
          request.stop_token_ids().end()) {
        reason = v1::FINISH_REASON_EOS;
        break;
      }
      pending.mutable_tokens()->add_ids(token);
      if (request.has_logprobs()) {
        *pending.mutable_tokens()->add_logprobs() = FakeLogprob(token, request.logprobs());
      }
      ++generated;
      if (pending.tokens().ids_size() >= b.chunk && !flush()) break;
    }
    flush();
    v1::DecodeEvent finished;
    finished.mutable_finished()->set_index(choice);
    finished.mutable_finished()->set_reason(reason);
    finished.mutable_finished()->set_completion_tokens(generated);
    finished.mutable_finished()->set_decode_queue_us(44);
    finished.mutable_finished()->set_prefill_us(request.local_prefill() ? 55 : 0);
    finished.mutable_finished()->set_kv_wait_us(request.local_prefill() ? 0 : 66);
    stream->writer->Write(std::move(finished));
  }
  stream->writer->Finish(grpc::Status::OK);
  done();
}

grpc::ServerUnaryReactor* FakeDecodeWorker::Start(grpc::CallbackServerContext* ctx,
                                                  const v1::StartRequest* request,
                                                  v1::StartResponse*) {
  std::shared_ptr<Stream> stream;
  {
    absl::MutexLock lock(&mu_);
    starts_.push_back(*request);
    for (const auto& s : streams_) {
      if (s->request.request_id() == request->request_id() && !s->request.local_prefill()) {
        stream = s;
      }
    }
  }
  if (stream == nullptr) {
    return Reply(ctx, grpc::Status(grpc::StatusCode::NOT_FOUND, "no such reservation"));
  }
  if (stream->generation != request->generation()) {
    return Reply(ctx, grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "stale generation"));
  }
  {
    absl::MutexLock lock(&stream->mu);
    if (stream->cancelled) {
      return Reply(ctx, grpc::Status(grpc::StatusCode::NOT_FOUND, "reservation cancelled"));
    }
    stream->started = true;
  }
  return Reply(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* FakeDecodeWorker::GetStats(grpc::CallbackServerContext* ctx,
                                                     const v1::StatsRequest*,
                                                     v1::WorkerStats* response) {
  absl::MutexLock lock(&mu_);
  ++stats_polls_;
  *response = Stats("decode", model_, vocab_size_, draining_, open_streams_);
  return Reply(ctx, grpc::Status::OK);
}

std::vector<v1::DecodeRequest> FakeDecodeWorker::requests() const {
  absl::MutexLock lock(&mu_);
  return requests_;
}

grpc::ServerUnaryReactor* FakeDecodeWorker::Handoff(grpc::CallbackServerContext* ctx,
                                                    const v1::HandoffRequest* request,
                                                    v1::HandoffResponse* response) {
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    handoffs_.push_back(*request);
    status = behaviour_.handoff;
  }
  response->set_kv_bytes(4096);
  return Reply(ctx, rpc::ToGrpc(status));
}

std::vector<v1::HandoffRequest> FakeDecodeWorker::handoffs() const {
  absl::MutexLock lock(&mu_);
  return handoffs_;
}

std::vector<v1::StartRequest> FakeDecodeWorker::starts() const {
  absl::MutexLock lock(&mu_);
  return starts_;
}

std::vector<uint64_t> FakeDecodeWorker::generations() const {
  absl::MutexLock lock(&mu_);
  return generations_;
}

int FakeDecodeWorker::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

int FakeDecodeWorker::stats_polls() const {
  absl::MutexLock lock(&mu_);
  return stats_polls_;
}

bool FakeDecodeWorker::WaitForCancelled(int n, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return cancelled_ >= n; };
  return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
}

bool FakeDecodeWorker::WaitForNoStreams(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto none = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return open_streams_ == 0; };
  return mu_.AwaitWithTimeout(absl::Condition(&none), timeout);
}

// ---------------------------------------------------------------------------
// FakePrefillWorker

namespace {

// Answers when the caller cancels (or the server shuts down).
class HoldReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit HoldReactor(std::function<void()> on_cancel) : on_cancel_(std::move(on_cancel)) {}
  void OnCancel() override {
    on_cancel_();
    Finish(grpc::Status(grpc::StatusCode::CANCELLED, "held until cancelled"));
  }
  void OnDone() override { delete this; }

 private:
  std::function<void()> on_cancel_;
};

}  // namespace

FakePrefillWorker::~FakePrefillWorker() = default;

void FakePrefillWorker::SetBehaviour(PrefillBehaviour b) {
  absl::MutexLock lock(&mu_);
  behaviour_ = std::move(b);
}

void FakePrefillWorker::SetModel(FakeModel model) {
  absl::MutexLock lock(&mu_);
  model_ = std::move(model);
}

grpc::ServerUnaryReactor* FakePrefillWorker::Prefill(grpc::CallbackServerContext* ctx,
                                                     const v1::PrefillRequest* request,
                                                     v1::PrefillResponse* response) {
  PrefillBehaviour b;
  {
    absl::MutexLock lock(&mu_);
    requests_.push_back(*request);
    b = behaviour_;
  }
  if (b.hold) {
    return new HoldReactor([this] {
      absl::MutexLock lock(&mu_);
      ++cancelled_;
    });
  }
  if (!b.fail.ok()) return Reply(ctx, rpc::ToGrpc(b.fail));
  response->set_first_token(b.first_token);
  const int n = std::max(1, request->n());
  for (int c = 1; c < n; ++c) response->add_extra_first_tokens(b.first_token + c);
  for (int c = 0; c < n; ++c) response->add_sampler_draws(c);
  if (request->has_logprobs()) {
    for (int c = 0; c < n; ++c) {
      *response->add_first_logprobs() = FakeLogprob(b.first_token + c, request->logprobs());
    }
  }
  if (request->prompt_logprobs()) {
    for (int i = 1; i < request->tokens_size(); ++i) {
      *response->add_prompt_logprobs() =
          FakeLogprob(request->tokens(i), request->has_logprobs() ? request->logprobs() : 0);
    }
  }
  response->set_queue_us(11);
  response->set_prefill_us(22);
  response->set_kv_transfer_us(33);
  response->set_kv_bytes(1024);
  response->set_cached_tokens(b.cached_tokens);
  return Reply(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* FakePrefillWorker::GetStats(grpc::CallbackServerContext* ctx,
                                                      const v1::StatsRequest*,
                                                      v1::WorkerStats* response) {
  absl::MutexLock lock(&mu_);
  *response = Stats("prefill", model_, vocab_size_, false, 0);
  return Reply(ctx, grpc::Status::OK);
}

std::vector<v1::PrefillRequest> FakePrefillWorker::requests() const {
  absl::MutexLock lock(&mu_);
  return requests_;
}

int FakePrefillWorker::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

bool FakePrefillWorker::WaitForCancelled(int n, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return cancelled_ >= n; };
  return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
}

// ---------------------------------------------------------------------------
// FakeTokenizer

absl::StatusOr<std::vector<int32_t>> FakeTokenizer::Encode(std::string_view text,
                                                           const EncodeOptions& options) const {
  std::vector<int32_t> ids;
  if (options.add_bos) ids.push_back(kFakeBos);
  for (absl::string_view word : absl::StrSplit(absl::string_view(text.data(), text.size()),
                                               absl::ByAnyChar(" \n"), absl::SkipEmpty())) {
    if (options.parse_special && (word == "<s>" || word == "</s>")) {
      ids.push_back(word == "<s>" ? kFakeBos : kFakeEos);
      continue;
    }
    int id = 0;
    if (word.size() < 2 || word[0] != 'w' || !absl::SimpleAtoi(word.substr(1), &id) || id < 3 ||
        id >= kFakeVocab) {
      return absl::InvalidArgumentError(absl::StrCat("fake tokenizer: no token '", word, "'"));
    }
    ids.push_back(id);
  }
  return ids;
}

absl::StatusOr<std::string> FakeTokenizer::Decode(int32_t prev, int32_t id) const {
  if (id < 0 || id >= kFakeVocab) return absl::InvalidArgumentError("id out of range");
  if (id < 3) return std::string();
  return absl::StrCat(prev == kFakeBos ? "" : " ", "w", id);
}

}  // namespace tandem::router::testing
