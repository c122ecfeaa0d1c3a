#include "tools/router_bench/instant_workers.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/rpc/stream_writer.h"

namespace tandem::router_bench {

namespace {

// Workers never generate more than this, whatever the request asks.
constexpr int kMaxTokens = 4096;

v1::WorkerStats Stats(const char* role, const InstantModel& model, int running) {
  v1::WorkerStats s;
  s.set_role(role);
  s.set_model(model.name);
  s.set_weights_fingerprint(model.weights_fingerprint);
  s.set_kv_dtype(model.kv_dtype);
  s.set_vocab_size(model.vocab_size);
  s.set_max_context(model.max_context);
  s.set_block_size(model.block_size);
  s.set_kv_blocks_total(model.kv_blocks);
  s.set_kv_blocks_free(model.kv_blocks);
  s.set_running(running);
  return s;
}

grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* ctx, grpc::Status status) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(std::move(status));
  return reactor;
}

v1::DecodeEvent TokenEvent(int i) {
  v1::DecodeEvent event;
  event.mutable_tokens()->add_ids(kFirstToken + 1 + i % 64);
  return event;
}

}  // namespace

class InstantDecodeWorker::Stream {
 public:
  Stream(std::string request_id, int max_tokens, bool local_prefill, bool hold,
         std::shared_ptr<rpc::StreamWriter<v1::DecodeEvent>> writer, std::atomic<int>* open)
      : request_id(std::move(request_id)),
        max_tokens(max_tokens),
        local_prefill(local_prefill),
        hold(hold),
        writer(std::move(writer)),
        open_(open) {}

  // Counts the stream out of the open ones, once.
  void End() {
    if (!ended_.exchange(true)) open_->fetch_sub(1);
  }

  const std::string request_id;
  const int max_tokens;
  const bool local_prefill;
  const bool hold;
  const std::shared_ptr<rpc::StreamWriter<v1::DecodeEvent>> writer;
  uint64_t generation = 0;

 private:
  std::atomic<int>* const open_;
  std::atomic<bool> ended_{false};
};

grpc::ServerWriteReactor<v1::DecodeEvent>* InstantDecodeWorker::Generate(
    grpc::CallbackServerContext*, const v1::DecodeRequest* request) {
  auto [reactor, writer] = rpc::StreamWriter<v1::DecodeEvent>::Create();
  open_.fetch_add(1);
  auto stream = std::make_shared<Stream>(request->request_id(),
                                         std::clamp(request->max_tokens(), 1, kMaxTokens),
                                         request->local_prefill(), hold_.load(), writer, &open_);
  writer->OnCancel([this, stream] {
    Forget(stream.get());
    stream->End();
  });
  if (request->local_prefill()) {
    if (stream->hold) {
      writer->Write(TokenEvent(0));
      Hold(stream);
    } else {
      Complete(stream, 0);
    }
    return reactor;
  }
  stream->generation = next_generation_.fetch_add(1);
  {
    absl::MutexLock lock(&mu_);
    reserved_[stream->request_id] = stream;
  }
  v1::DecodeEvent event;
  event.mutable_reserved()->set_kv_descriptor(absl::StrCat("kv:", stream->request_id));
  event.mutable_reserved()->set_generation(stream->generation);
  writer->Write(std::move(event));
  return reactor;
}

grpc::ServerUnaryReactor* InstantDecodeWorker::Start(grpc::CallbackServerContext* ctx,
                                                     const v1::StartRequest* request,
                                                     v1::StartResponse*) {
  std::shared_ptr<Stream> stream;
  {
    absl::MutexLock lock(&mu_);
    auto it = reserved_.find(request->request_id());
    if (it != reserved_.end() && it->second->generation == request->generation()) {
      stream = std::move(it->second);
      reserved_.erase(it);
    }
  }
  if (stream == nullptr) {
    return Reply(ctx, grpc::Status(grpc::StatusCode::NOT_FOUND, "no such reservation"));
  }
  // The first token came from the prefill worker.
  if (stream->hold) {
    Hold(stream);
  } else {
    Complete(stream, 1);
  }
  return Reply(ctx, grpc::Status::OK);
}

void InstantDecodeWorker::Complete(const std::shared_ptr<Stream>& stream, int from) {
  for (int i = from; i < stream->max_tokens; ++i) {
    if (!stream->writer->Write(TokenEvent(i))) break;
  }
  v1::DecodeEvent finished;
  finished.mutable_finished()->set_reason(v1::FINISH_REASON_LENGTH);
  finished.mutable_finished()->set_completion_tokens(stream->max_tokens);
  stream->writer->Write(std::move(finished));
  stream->writer->Finish(grpc::Status::OK);
  stream->End();
}

void InstantDecodeWorker::Hold(const std::shared_ptr<Stream>& stream) {
  absl::MutexLock lock(&mu_);
  held_[stream.get()] = stream;
}

void InstantDecodeWorker::Forget(const Stream* stream) {
  absl::MutexLock lock(&mu_);
  held_.erase(stream);
  auto it = reserved_.find(stream->request_id);
  if (it != reserved_.end() && it->second.get() == stream) reserved_.erase(it);
}

int InstantDecodeWorker::ReleaseHeld() {
  absl::flat_hash_map<const Stream*, std::shared_ptr<Stream>> held;
  {
    absl::MutexLock lock(&mu_);
    held.swap(held_);
  }
  for (auto& [unused, stream] : held) Complete(stream, 1);
  return static_cast<int>(held.size());
}

bool InstantDecodeWorker::WaitForHeld(int n, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<int>(held_.size()) >= n;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
}

int InstantDecodeWorker::held() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(held_.size());
}

grpc::ServerUnaryReactor* InstantDecodeWorker::GetStats(grpc::CallbackServerContext* ctx,
                                                        const v1::StatsRequest*,
                                                        v1::WorkerStats* response) {
  *response = Stats("decode", model_, open_.load());
  return Reply(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* InstantPrefillWorker::Prefill(grpc::CallbackServerContext* ctx,
                                                        const v1::PrefillRequest* request,
                                                        v1::PrefillResponse* response) {
  response->set_first_token(kFirstToken);
  // One first token and one (greedy: zero) draw count per choice.
  const int n = std::max(1, request->n());
  for (int c = 1; c < n; ++c) response->add_extra_first_tokens(kFirstToken);
  for (int c = 0; c < n; ++c) response->add_sampler_draws(0);
  return Reply(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* InstantPrefillWorker::GetStats(grpc::CallbackServerContext* ctx,
                                                         const v1::StatsRequest*,
                                                         v1::WorkerStats* response) {
  *response = Stats("prefill", model_, 0);
  return Reply(ctx, grpc::Status::OK);
}

}  // namespace tandem::router_bench
