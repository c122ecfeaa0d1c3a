#include "tests/unit/router/router_harness.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/rpc/grpc_status.h"
#include "router/grpc_worker_channel.h"

namespace tandem::router::testing {

RouterHarness::RouterHarness(HarnessOptions options)
    : options_(std::move(options)),
      chat_template_(*ChatTemplate::FromString(kDefaultChatTemplate, std::nullopt, std::nullopt)) {}

RouterHarness::~RouterHarness() {
  // Router first, so that its requests end before the workers go.
  if (router_server_.server != nullptr) {
    router_server_.server->Shutdown(rpc::ToChrono(absl::Now() + absl::Seconds(5)));
  }
  service_.reset();
  core_.reset();
  if (registry_ != nullptr) registry_->Stop();
  for (auto* servers : {&prefill_servers_, &decode_servers_}) {
    for (rpc::RunningServer& s : *servers) {
      if (s.server != nullptr) s.server->Shutdown(rpc::ToChrono(absl::Now() + absl::Seconds(5)));
    }
  }
}

absl::Status RouterHarness::Start() {
  RegistryOptions registry_options;
  registry_options.channels = GrpcWorkerChannels({}, options_.router.clock).value();
  registry_options.clock = options_.router.clock;
  registry_options.health_interval = absl::Milliseconds(50);
  // The fake workers answer at once; a loaded machine must not turn a slow
  // poll into an unhealthy worker (a stopped server fails at once anyway).
  registry_options.health_timeout = absl::Seconds(30);
  registry_options.resolve_interval = absl::Seconds(1);
  for (int i = 0; i < options_.prefill; ++i) {
    prefill_.push_back(std::make_unique<FakePrefillWorker>(options_.vocab_size));
    absl::StatusOr<rpc::RunningServer> s = rpc::StartServer({}, {prefill_.back().get()});
    if (!s.ok()) return s.status();
    prefill_addresses_.push_back(absl::StrCat("127.0.0.1:", s->port));
    prefill_servers_.push_back(*std::move(s));
  }
  for (int i = 0; i < options_.decode; ++i) {
    decode_.push_back(std::make_unique<FakeDecodeWorker>(options_.vocab_size));
    absl::StatusOr<rpc::RunningServer> s = rpc::StartServer({}, {decode_.back().get()});
    if (!s.ok()) return s.status();
    decode_addresses_.push_back(absl::StrCat("127.0.0.1:", s->port));
    decode_servers_.push_back(*std::move(s));
  }
  registry_options.prefill_targets = prefill_addresses_;
  registry_options.decode_targets = decode_addresses_;
  const Tokenizer* tokenizer =
      options_.no_tokenizer
          ? nullptr
          : (options_.tokenizer != nullptr ? options_.tokenizer : &fake_tokenizer_);
  if (tokenizer != nullptr) registry_options.tokenizer_vocab_size = tokenizer->vocab_size();
  absl::StatusOr<std::unique_ptr<WorkerRegistry>> registry =
      WorkerRegistry::Create(registry_options);
  if (!registry.ok()) return registry.status();
  registry_ = *std::move(registry);

  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  for (WorkerRole role : {WorkerRole::kPrefill, WorkerRole::kDecode}) {
    while (true) {
      const std::vector<WorkerSnapshot> all = registry_->Snapshot(role);
      if (std::all_of(all.begin(), all.end(), [](const auto& s) { return s.routable(); })) break;
      if (absl::Now() > deadline) return absl::DeadlineExceededError("workers not healthy");
      registry_->PollNow();
    }
  }
  core_ = std::make_unique<RouterCore>(registry_.get(), tokenizer,
                                       options_.no_chat_template           ? nullptr
                                       : options_.chat_template != nullptr ? options_.chat_template
                                                                           : &chat_template_,
                                       options_.router);
  service_ =
      std::make_unique<RouterService>(core_.get(), options_.authorize, options_.router.clock);
  absl::StatusOr<rpc::RunningServer> s = rpc::StartServer({}, {service_.get()});
  if (!s.ok()) return s.status();
  router_server_ = *std::move(s);
  stub_ = v1::Router::NewStub(rpc::MakeChannel(absl::StrCat("127.0.0.1:", router_server_.port)));
  return absl::OkStatus();
}

int RouterHarness::FirstPrefill() const {
  return static_cast<int>(std::min_element(prefill_addresses_.begin(), prefill_addresses_.end()) -
                          prefill_addresses_.begin());
}

int RouterHarness::FirstDecode() const {
  return static_cast<int>(std::min_element(decode_addresses_.begin(), decode_addresses_.end()) -
                          decode_addresses_.begin());
}

void RouterHarness::StopDecodeServer(int i) {
  decode_servers_[i].server->Shutdown(rpc::ToChrono(absl::Now() + absl::Seconds(5)));
  decode_servers_[i].server.reset();
}

Result RouterHarness::Run(const v1::GenerateRequest& request, absl::Duration timeout) {
  Result r;
  grpc::ClientContext ctx;
  ctx.set_deadline(rpc::ToChrono(absl::Now() + timeout));
  auto reader = stub_->Generate(&ctx, request);
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
    r.tokens.insert(r.tokens.end(), response.token_ids().begin(), response.token_ids().end());
    r.text += response.text();
    if (response.has_finished()) r.finished = response.finished();
    r.messages.push_back(response);
  }
  r.status = reader->Finish();
  return r;
}

v1::GenerateRequest TokenRequest(std::vector<int32_t> ids, int max_tokens) {
  v1::GenerateRequest r;
  r.mutable_token_ids();  // Set even when empty.
  for (int32_t id : ids) r.mutable_token_ids()->add_ids(id);
  r.set_max_tokens(max_tokens);
  return r;
}

}  // namespace tandem::router::testing
