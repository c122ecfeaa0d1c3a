#include "tools/router_bench/stream_client.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tandem/v1/generate.grpc.pb.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::router_bench {

namespace {

bool HasToken(const v1::GenerateResponse& response) { return response.token_ids_size() > 0; }
bool HasToken(const v1::DecodeEvent& event) {
  return event.has_tokens() && event.tokens().ids_size() > 0;
}

// One server-streaming call; deletes itself once done.
template <typename Request, typename Response>
class StreamCall final : public grpc::ClientReadReactor<Response> {
 public:
  StreamCall(Request request, StreamTarget::OnFirst on_first, StreamTarget::OnDone on_done)
      : request_(std::move(request)),
        on_first_(std::move(on_first)),
        on_done_(std::move(on_done)) {}

  template <typename Stub>
  void Start(Stub* stub, absl::Duration timeout) {
    context_.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
    sent_ = std::chrono::steady_clock::now();
    stub->async()->Generate(&context_, &request_, this);
    this->StartRead(&response_);
    this->StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows.
    if (!outcome_.got_token && HasToken(response_)) {
      outcome_.got_token = true;
      outcome_.ttft = absl::FromChrono(std::chrono::steady_clock::now() - sent_);
      if (on_first_) on_first_();
    }
    this->StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override {
    outcome_.code = status.error_code();
    outcome_.message = status.error_message();
    on_done_(outcome_);
    delete this;
  }

 private:
  grpc::ClientContext context_;
  const Request request_;
  Response response_;
  const StreamTarget::OnFirst on_first_;
  const StreamTarget::OnDone on_done_;
  std::chrono::steady_clock::time_point sent_;
  CallOutcome outcome_;
};

std::vector<std::vector<int32_t>> MakePrompts(const TargetOptions& options) {
  std::mt19937_64 rng(options.seed);
  std::uniform_int_distribution<int32_t> id(3, std::max(3, options.vocab_size - 1));
  std::vector<std::vector<int32_t>> prompts(64);
  for (auto& prompt : prompts) {
    prompt.resize(std::max(1, options.prompt_tokens));
    for (int32_t& t : prompt) t = id(rng);
  }
  return prompts;
}

std::vector<std::shared_ptr<grpc::Channel>> MakeChannels(const TargetOptions& options) {
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < std::max(1, options.channels); ++i) {
    grpc::ChannelArguments args;
    // Distinct arguments and a private subchannel pool: one connection each.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt("tandem.router_bench.channel", i);
    channels.push_back(
        grpc::CreateCustomChannel(options.address, grpc::InsecureChannelCredentials(), args));
  }
  return channels;
}

// Round robin over channels and prompts.
template <typename Service>
class Target final : public StreamTarget {
 public:
  using Stub = typename Service::Stub;
  using Request = std::conditional_t<std::is_same_v<Service, v1::Router>, v1::GenerateRequest,
                                     v1::DecodeRequest>;
  using Response = std::conditional_t<std::is_same_v<Service, v1::Router>, v1::GenerateResponse,
                                      v1::DecodeEvent>;

  explicit Target(const TargetOptions& options)
      : timeout_(options.timeout), prompts_(MakePrompts(options)) {
    for (const auto& channel : MakeChannels(options)) stubs_.push_back(Service::NewStub(channel));
  }

  void Call(int max_tokens, OnFirst on_first, OnDone on_done) override {
    const uint64_t i = next_.fetch_add(1, std::memory_order_relaxed);
    const std::vector<int32_t>& prompt = prompts_[i % prompts_.size()];
    auto* call = new StreamCall<Request, Response>(MakeRequest(i, prompt, max_tokens),
                                                   std::move(on_first), std::move(on_done));
    call->Start(stubs_[i % stubs_.size()].get(), timeout_);
  }

 private:
  static Request MakeRequest(uint64_t i, const std::vector<int32_t>& prompt, int max_tokens) {
    Request request;
    request.set_request_id(absl::StrCat("bench-", i));
    request.set_max_tokens(max_tokens);
    if constexpr (std::is_same_v<Service, v1::Router>) {
      request.mutable_token_ids()->mutable_ids()->Assign(prompt.begin(), prompt.end());
    } else {
      request.mutable_prompt()->Assign(prompt.begin(), prompt.end());
      request.set_local_prefill(true);
    }
    return request;
  }

  // Constant after construction.
  const absl::Duration timeout_;
  const std::vector<std::vector<int32_t>> prompts_;
  std::vector<std::unique_ptr<Stub>> stubs_;

  std::atomic<uint64_t> next_{0};
};

}  // namespace

std::unique_ptr<StreamTarget> RouterTarget(const TargetOptions& options) {
  return std::make_unique<Target<v1::Router>>(options);
}

std::unique_ptr<StreamTarget> DecodeWorkerTarget(const TargetOptions& options) {
  return std::make_unique<Target<v1::DecodeWorker>>(options);
}

}  // namespace tandem::router_bench
