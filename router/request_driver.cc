#include "router/request_driver.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/rpc/grpc_status.h"
#include "router/routing_policy.h"

namespace tandem::router {

// A ClientContext bounded by the request's deadline that Cancel() reaches
// for as long as it exists. Declare it before the reader that uses it, so
// that the reader goes first.
class RequestDriver::Call {
 public:
  explicit Call(RequestDriver* driver) : driver_(driver) {
    ctx_.set_deadline(rpc::ToChrono(driver->deadline_));
    absl::MutexLock lock(&driver_->mu_);
    driver_->calls_.insert(&ctx_);
    // Applied when the call starts if it has not yet.
    if (driver_->cancelled_) ctx_.TryCancel();
  }
  ~Call() {
    absl::MutexLock lock(&driver_->mu_);
    driver_->calls_.erase(&ctx_);
  }
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

  grpc::ClientContext* get() { return &ctx_; }
  void Cancel() { ctx_.TryCancel(); }

 private:
  RequestDriver* const driver_;
  grpc::ClientContext ctx_;
};

namespace {

// Reads a cancelled or finishing stream to its end and returns its status.
grpc::Status DrainAndFinish(grpc::ClientReader<v1::DecodeEvent>& reader) {
  v1::DecodeEvent ignored;
  while (reader.Read(&ignored)) {
  }
  return reader.Finish();
}

// What the client sees when every prefill attempt failed: overload and
// deadlines keep their meaning; anything else means no prefill worker could
// serve the request.
absl::StatusCode PrefillFailureCode(absl::StatusCode worker_code) {
  switch (worker_code) {
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kDeadlineExceeded:
      return worker_code;
    default:
      return absl::StatusCode::kUnavailable;
  }
}

}  // namespace

RequestDriver::RequestDriver(WorkerRegistry* registry, const Tokenizer* tokenizer,
                             const Clock& clock, DriverOptions options, v1::GenerateRequest request,
                             std::string request_id, std::string worker_request_id,
                             absl::Time arrival, absl::Time grpc_deadline,
                             std::shared_ptr<rpc::StreamWriter<v1::GenerateResponse>> writer)
    : registry_(registry),
      tokenizer_(tokenizer),
      clock_(clock),
      options_(options),
      request_(std::move(request)),
      request_id_(std::move(request_id)),
      worker_request_id_(std::move(worker_request_id)),
      arrival_(arrival),
      grpc_deadline_(grpc_deadline),
      writer_(std::move(writer)) {}

void RequestDriver::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  for (grpc::ClientContext* ctx : calls_) ctx->TryCancel();
}

void RequestDriver::Run() {
  const absl::Status status = Drive();
  // Counted before the client learns the status, so that a client that
  // scrapes the metrics after its request ended sees it counted.
  Log(status);
  writer_->Finish(rpc::ToGrpc(status));
}

int64_t RequestDriver::SinceArrivalUs() const {
  return std::max<int64_t>(1, absl::ToInt64Microseconds(clock_.Now() - arrival_));
}

std::optional<absl::Status> RequestDriver::OwnFault() const {
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return absl::CancelledError("the request was cancelled by the client");
  }
  if (client_gone_) return absl::CancelledError("the client went away");
  // gRPC ends calls at the deadline; the margin absorbs clock rounding.
  if (absl::Now() >= deadline_ - absl::Milliseconds(5)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "the request did not finish within its deadline (",
        absl::ToInt64Milliseconds(deadline_ - arrival_),
        " ms); raise timeout_ms, the gRPC deadline or the router's --request_timeout"));
  }
  return std::nullopt;
}

absl::Status RequestDriver::Drive() {
  ASSIGN_OR_RETURN(req_, ValidateRequest(request_, tokenizer_, options_.chat_template));
  const absl::Duration timeout = request_.timeout_ms() > 0
                                     ? absl::Milliseconds(request_.timeout_ms())
                                     : options_.request_timeout;
  deadline_ = std::min(grpc_deadline_, absl::Now() + timeout);

  const std::vector<WorkerSnapshot> decode = registry_->Snapshot(WorkerRole::kDecode);
  int vocab_size = tokenizer_ != nullptr ? tokenizer_->vocab_size() : 0;
  int max_context = 0;
  bool any_routable = false;
  std::vector<std::string> unroutable;
  for (const WorkerSnapshot& s : decode) {
    if (!s.routable()) {
      const std::string why = !s.healthy   ? "unhealthy"
                              : s.draining ? "draining"
                              : s.disagreement.empty()
                                  ? "not yet checked against the pool"
                                  : absl::StrCat("out of the pool: it ", s.disagreement);
      unroutable.push_back(absl::StrCat(s.address, " (", why, ")"));
      continue;
    }
    any_routable = true;
    if (s.vocab_size > 0) vocab_size = s.vocab_size;
    if (s.max_context > 0) {
      max_context = max_context == 0 ? s.max_context : std::min(max_context, s.max_context);
    }
  }
  if (!any_routable) {
    return absl::UnavailableError(absl::StrCat(
        "no healthy decode worker to serve the request",
        unroutable.empty() ? "" : absl::StrCat(" (", absl::StrJoin(unroutable, ", "), ")"),
        "; retry later"));
  }
  RETURN_IF_ERROR(CheckModelLimits(req_.prompt, vocab_size, max_context));
  if (tokenizer_ != nullptr) detok_.emplace(*tokenizer_, req_.prompt.back());
  stop_.emplace(req_.stop);

  const PrefillDecision decision =
      DecidePrefill(registry_->Snapshot(WorkerRole::kPrefill), static_cast<int>(req_.prompt.size()),
                    options_.local_prefill_tokens);
  why_ = decision.reason;
  return decision.local ? RunLocal() : RunDisaggregated();
}

v1::DecodeRequest RequestDriver::MakeDecodeRequest(bool local) {
  v1::DecodeRequest r;
  r.set_request_id(absl::StrCat(worker_request_id_, ".", decode_streams_opened_++));
  r.mutable_prompt()->Assign(req_.prompt.begin(), req_.prompt.end());
  *r.mutable_sampling() = req_.sampling;
  r.set_max_tokens(req_.max_tokens);
  r.set_local_prefill(local);
  r.mutable_stop_token_ids()->Assign(req_.stop_token_ids.begin(), req_.stop_token_ids.end());
  return r;
}

absl::StatusOr<RequestDriver::DecodeStream> RequestDriver::OpenDecode(bool local) {
  absl::flat_hash_set<std::string> tried;
  std::vector<std::string> refusals;
  bool all_full = true;  // Every refusal so far was RESOURCE_EXHAUSTED.
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::optional<Pick> pick =
        PickDecodeWorker(registry_->Snapshot(WorkerRole::kDecode),
                         static_cast<int>(req_.prompt.size()), req_.max_tokens, tried);
    if (!pick.has_value()) break;
    DecodeStream stream;
    stream.worker = registry_->Find(WorkerRole::kDecode, pick->address);
    if (stream.worker == nullptr) {
      tried.insert(pick->address);
      refusals.push_back(absl::StrCat(pick->address, " left the pool"));
      continue;
    }
    absl::StrAppend(&why_, "; ", pick->reason);
    decode_address_ = stream.worker->address();
    stream.load = stream.worker->StartRequest();
    stream.load->ReserveBlocks(BlocksFor(static_cast<int>(req_.prompt.size()) + req_.max_tokens,
                                         stream.worker->Snapshot().block_size));
    stream.call = std::make_unique<Call>(this);
    if (timeline_.router_queue_us() == 0) timeline_.set_router_queue_us(SinceArrivalUs());
    stream.reader =
        stream.worker->decode_stub()->Generate(stream.call->get(), MakeDecodeRequest(local));
    if (stream.reader->Read(&stream.first)) {
      // The worker admitted the request and holds its blocks.
      stream.load->ConfirmReservation();
      return stream;
    }
    const absl::Status status = rpc::FromGrpc(stream.reader->Finish());
    if (std::optional<absl::Status> own = OwnFault()) return *own;
    const std::string message =
        absl::StrCat("decode worker ", stream.worker->address(), " did not admit the request: ",
                     status.ok() ? "its stream ended at once" : status.ToString());
    if (status.code() != absl::StatusCode::kUnavailable &&
        status.code() != absl::StatusCode::kResourceExhausted) {
      return absl::Status(status.ok() ? absl::StatusCode::kInternal : status.code(), message);
    }
    // Gone, draining or full (its stats lag behind the router's other
    // requests): another decode worker can take the request.
    if (status.code() == absl::StatusCode::kUnavailable) {
      stream.worker->MarkUnavailable(status);
      all_full = false;
    }
    tried.insert(stream.worker->address());
    refusals.push_back(message);
    LOG(WARNING) << "request " << request_id_ << ": " << message
                 << (attempt == 0 ? "; trying another decode worker" : "");
  }
  if (refusals.empty()) {
    return absl::UnavailableError("no healthy decode worker to serve the request; retry later");
  }
  if (all_full) return absl::ResourceExhaustedError(absl::StrJoin(refusals, "; "));
  return absl::UnavailableError(absl::StrJoin(refusals, "; "));
}

absl::Status RequestDriver::RunLocal() {
  ASSIGN_OR_RETURN(DecodeStream stream, OpenDecode(/*local=*/true));
  disaggregated_ = false;
  return ForwardDecodeStream(stream, &stream.first);
}

absl::Status RequestDriver::RunDisaggregated() {
  absl::flat_hash_set<std::string> tried;
  absl::StatusCode last_code = absl::StatusCode::kUnavailable;
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (attempt > 0 && options_.metrics != nullptr) options_.metrics->prefill_retries.Increment();
    std::optional<Pick> pick = PickPrefillWorker(registry_->Snapshot(WorkerRole::kPrefill), tried);
    if (!pick.has_value()) {
      if (attempt == 0) {
        // The pool emptied since the decision: the decode worker can still serve.
        absl::StrAppend(&why_, "; no prefill worker left, local prefill");
        return RunLocal();
      }
      break;
    }
    absl::StrAppend(&why_, "; ", pick->reason);
    bool prefill_failed = false;
    absl::Status status = TryDisaggregated(pick->address, &prefill_failed);
    if (!prefill_failed) return status;
    tried.insert(pick->address);
    last_code = status.code();
    if (std::optional<absl::Status> own = OwnFault()) return *own;
  }
  return absl::Status(
      PrefillFailureCode(last_code),
      absl::StrCat("prefill failed on ", absl::StrJoin(prefill_errors_, "; and on "),
                   tried.size() < 2 ? " (no other healthy prefill worker to retry on)" : ""));
}

absl::Status RequestDriver::TryDisaggregated(const std::string& prefill_address,
                                             bool* prefill_failed) {
  std::shared_ptr<Worker> prefill = registry_->Find(WorkerRole::kPrefill, prefill_address);
  if (prefill == nullptr) {
    *prefill_failed = true;
    prefill_errors_.push_back(
        absl::StrCat("prefill worker ", prefill_address, " (it left the pool)"));
    return absl::UnavailableError("prefill worker left the pool");
  }
  // 1. Reserve KV blocks on a decode worker.
  ASSIGN_OR_RETURN(DecodeStream decode, OpenDecode(/*local=*/false));
  if (!decode.first.has_reserved()) {
    decode.call->Cancel();
    DrainAndFinish(*decode.reader);
    return absl::InternalError(absl::StrCat(
        "decode worker ", decode.worker->address(), " sent event ", decode.first.event_case(),
        " before `reserved`; is it a tandem decode worker of this version?"));
  }
  const v1::Reserved reserved = decode.first.reserved();
  const std::string worker_request_id =
      absl::StrCat(worker_request_id_, ".", decode_streams_opened_ - 1);

  // 2. Prefill, shipping the KV cache to the reservation.
  v1::PrefillRequest prefill_request;
  prefill_request.set_request_id(worker_request_id);
  prefill_request.mutable_tokens()->Assign(req_.prompt.begin(), req_.prompt.end());
  *prefill_request.mutable_sampling() = req_.sampling;
  prefill_request.set_kv_descriptor(reserved.kv_descriptor());
  v1::PrefillResponse prefill_response;
  grpc::Status prefill_status;
  {
    std::unique_ptr<Worker::Load> prefill_load = prefill->StartRequest();
    Call prefill_call(this);
    prefill_status =
        prefill->prefill_stub()->Prefill(prefill_call.get(), prefill_request, &prefill_response);
  }
  if (!prefill_status.ok()) {
    // Cancelling the decode stream frees the reservation.
    decode.call->Cancel();
    DrainAndFinish(*decode.reader);
    if (std::optional<absl::Status> own = OwnFault()) return *own;
    *prefill_failed = true;
    const absl::Status status = rpc::FromGrpc(prefill_status);
    if (status.code() == absl::StatusCode::kUnavailable) prefill->MarkUnavailable(status);
    prefill_errors_.push_back(
        absl::StrCat("prefill worker ", prefill_address, ": ", status.ToString()));
    LOG(WARNING) << "request " << request_id_ << ": prefill on " << prefill_address
                 << " failed: " << status
                 << (prefill_errors_.size() == 1 ? "; retrying on another prefill worker" : "");
    return status;
  }
  disaggregated_ = true;
  prefill_address_ = prefill_address;
  timeline_.set_prefill_queue_us(prefill_response.queue_us());
  timeline_.set_prefill_us(prefill_response.prefill_us());
  timeline_.set_kv_transfer_us(prefill_response.kv_transfer_us());

  // 3. The first token goes to the client at once; then decoding starts.
  if (!Emit({prefill_response.first_token()}, /*from_prefill=*/true)) {
    decode.call->Cancel();
    DrainAndFinish(*decode.reader);
    if (std::optional<absl::Status> own = OwnFault()) return *own;
    return SendFinal();
  }
  grpc::Status start_status;
  {
    Call start_call(this);
    v1::StartRequest start;
    start.set_request_id(worker_request_id);
    start.set_generation(reserved.generation());
    start.set_first_token(prefill_response.first_token());
    v1::StartResponse ignored;
    start_status = decode.worker->decode_stub()->Start(start_call.get(), start, &ignored);
  }
  if (!start_status.ok()) {
    decode.call->Cancel();
    DrainAndFinish(*decode.reader);
    if (std::optional<absl::Status> own = OwnFault()) return *own;
    const absl::Status status = rpc::FromGrpc(start_status);
    if (status.code() == absl::StatusCode::kUnavailable) decode.worker->MarkUnavailable(status);
    return absl::UnavailableError(absl::StrCat("decode worker ", decode.worker->address(),
                                               " was lost mid-stream after ", completion_tokens_,
                                               " tokens: Start failed: ", status.ToString()));
  }
  return ForwardDecodeStream(decode, nullptr);
}

bool RequestDriver::HandleDecodeEvent(const v1::DecodeEvent& event, bool* worker_finished,
                                      bool* protocol_error) {
  if (event.has_tokens()) {
    const std::vector<int32_t> ids(event.tokens().ids().begin(), event.tokens().ids().end());
    return Emit(ids, /*from_prefill=*/false);
  }
  if (event.has_finished()) {
    *worker_finished = true;
    const v1::DecodeFinished& f = event.finished();
    if (!finish_.has_value()) finish_ = f.reason();
    timeline_.set_decode_queue_us(f.decode_queue_us());
    if (!disaggregated_) timeline_.set_prefill_us(f.prefill_us());
    // The stream ends next; read on to its status.
    return true;
  }
  *protocol_error = true;
  return false;
}

absl::Status RequestDriver::ForwardDecodeStream(DecodeStream& stream,
                                                const v1::DecodeEvent* first) {
  bool worker_finished = false;
  bool protocol_error = false;
  bool reading = first == nullptr || HandleDecodeEvent(*first, &worker_finished, &protocol_error);
  v1::DecodeEvent event;
  while (reading && stream.reader->Read(&event)) {
    reading = HandleDecodeEvent(event, &worker_finished, &protocol_error);
  }
  // Stopped early by the router (stop string, client gone, bad event):
  // cancelling frees the worker's blocks.
  if (!reading) stream.call->Cancel();
  const absl::Status status = rpc::FromGrpc(DrainAndFinish(*stream.reader));
  const std::string& address = stream.worker->address();
  if (client_gone_) return absl::CancelledError("the client went away");
  if (protocol_error) {
    return absl::InternalError(
        absl::StrCat("decode worker ", address, " sent an unexpected event mid-stream"));
  }
  // Ended by the worker's `finished`, or by the router (stop string, EOS).
  if (worker_finished || finish_.has_value()) return SendFinal();
  if (std::optional<absl::Status> own = OwnFault()) return *own;
  const absl::Status cause =
      status.ok() ? absl::InternalError("the stream ended without a finished event") : status;
  if (cause.code() == absl::StatusCode::kUnavailable) stream.worker->MarkUnavailable(cause);
  if (completion_tokens_ > 0) {
    return absl::UnavailableError(absl::StrCat("decode worker ", address,
                                               " was lost mid-stream after ", completion_tokens_,
                                               " tokens: ", cause.ToString()));
  }
  return absl::Status(cause.code(), absl::StrCat("decode worker ", address,
                                                 " failed the request: ", cause.message()));
}

bool RequestDriver::Emit(const std::vector<int32_t>& ids, bool from_prefill) {
  v1::GenerateResponse message;
  std::string text;
  for (int32_t id : ids) {
    if (finish_.has_value()) break;
    // Workers never return more than max_tokens; a faulty one is cut here.
    if (completion_tokens_ >= req_.max_tokens) break;
    if (std::find(req_.stop_token_ids.begin(), req_.stop_token_ids.end(), id) !=
        req_.stop_token_ids.end()) {
      // The prefill worker's first token can be EOS; it is not returned.
      finish_ = v1::FINISH_REASON_EOS;
      break;
    }
    message.add_token_ids(id);
    ++completion_tokens_;
    if (detok_.has_value()) {
      absl::StatusOr<std::string> piece = detok_->Push(id);
      if (!piece.ok()) {
        LOG(WARNING) << "request " << request_id_ << ": " << piece.status();
      } else {
        text += stop_->Push(*piece);
        if (stop_->stopped()) finish_ = v1::FINISH_REASON_STOP;
      }
    }
    if (from_prefill && !finish_.has_value() && completion_tokens_ >= req_.max_tokens) {
      finish_ = v1::FINISH_REASON_LENGTH;
    }
  }
  if (message.token_ids_size() > 0 || !text.empty()) {
    message.set_text(std::move(text));
    if (timeline_.first_token_us() == 0) timeline_.set_first_token_us(SinceArrivalUs());
    if (options_.metrics != nullptr) {
      const absl::Time now = clock_.Now();
      if (last_token_sent_ == absl::Time()) {
        options_.metrics->time_to_first_token.Observe(metrics::Seconds(now - arrival_));
      } else {
        options_.metrics->inter_token_latency.Observe(metrics::Seconds(now - last_token_sent_));
      }
      last_token_sent_ = now;
    }
    if (!writer_->Write(std::move(message))) {
      client_gone_ = true;
      return false;
    }
  }
  return !finish_.has_value();
}

absl::Status RequestDriver::SendFinal() {
  v1::GenerateResponse message;
  if (detok_.has_value() && !stop_->stopped()) {
    std::string tail = stop_->Push(detok_->Flush());
    // A stop string can no longer complete: what was held back is text.
    if (!stop_->stopped()) tail += stop_->Flush();
    message.set_text(std::move(tail));
  }
  if (stop_->stopped()) finish_ = v1::FINISH_REASON_STOP;
  v1::Finished* f = message.mutable_finished();
  f->set_reason(finish_.value_or(v1::FINISH_REASON_UNSPECIFIED));
  f->mutable_usage()->set_prompt_tokens(static_cast<int32_t>(req_.prompt.size()));
  f->mutable_usage()->set_completion_tokens(completion_tokens_);
  timeline_.set_end_us(SinceArrivalUs());
  *f->mutable_timeline() = timeline_;
  f->set_prefill_worker(prefill_address_);
  f->set_decode_worker(decode_address_);
  f->set_disaggregated(disaggregated_);
  if (!writer_->Write(std::move(message))) {
    client_gone_ = true;
    return absl::CancelledError("the client went away");
  }
  return absl::OkStatus();
}

}  // namespace tandem::router
