// tandem-router: the client-facing tandem.v1.Router service in front of the
// prefill and decode pools.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/executor.h"
#include "common/base/flags.h"
#include "common/base/logging.h"
#include "common/base/port_file.h"
#include "common/base/served_model.h"
#include "common/base/status_macros.h"
#include "common/chat/chat_template.h"
#include "common/http/http_server.h"
#include "common/metrics/metrics_server.h"
#include "common/rpc/auth.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/server.h"
#include "common/rpc/tls.h"
#include "common/rpc/tls_flags.h"
#include "common/tokenizer/tokenizer.h"
#include "router/api_keys.h"
#include "router/grpc_worker_channel.h"
#include "router/openai_routes.h"
#include "router/prefix_routing.h"
#include "router/router_core.h"
#include "router/router_metrics.h"
#include "router/router_service.h"
#include "router/worker_registry.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:8100", "host:port to serve on; port 0 picks a free one");
ABSL_FLAG(std::string, port_file, "",
          "Write the bound port here (one line) once the server is up; empty = don't");
ABSL_FLAG(std::string, prefill_workers, "",
          "Prefill workers, comma-separated host:port; a DNS name stands for every address it "
          "resolves to; file:PATH stands for the host:port lines of that file ('#' comments), "
          "re-read like names every --resolve_interval (replace it atomically). Empty = "
          "colocated mode (decode workers prefill locally)");
ABSL_FLAG(std::string, decode_workers, "",
          "Decode workers, comma-separated host:port (required); DNS names and file:PATH as for "
          "--prefill_workers");
ABSL_FLAG(std::string, model, "",
          "The served model's Hugging Face folder: the router loads only its tokenizer "
          "(tokenizer.json or tokenizer.model) and chat template (chat_template.jinja or "
          "tokenizer_config.json) and serves it under the folder's name. Give this or "
          "--tokenizer");
ABSL_FLAG(std::string, tokenizer, "",
          "Tokenizer of the served model: a model folder, a tokenizer.json, a llama2.c "
          "tokenizer.bin or a SentencePiece .model. Give this or --model (with both, the "
          "tokenizer comes from here)");
ABSL_FLAG(int, prefill_burst_queue, 0,
          "Prefill a prompt on its decode worker when every prefill worker holds at least this "
          "many prompts and some decode worker has nothing waiting (decode workers absorb "
          "prefill bursts); 0: never");
ABSL_FLAG(int, local_prefill_tokens, 0,
          "Prompts of at most this many tokens are prefilled on the decode worker (conditional "
          "disaggregation); 0 = always use a prefill worker when one is healthy");
ABSL_FLAG(std::string, routing_policy, "prefix",
          "How workers are picked: 'prefix' (by the prompt tokens a worker holds in its prefix "
          "cache, per the router's index of where it sent prompts, against its load) or 'load' "
          "(by load alone)");
ABSL_FLAG(int, prefix_routing_load_tokens, 256,
          "With --routing_policy=prefix: what one request queued or running on a worker costs, "
          "in prompt tokens; a worker holding N more cached prompt tokens than another wins "
          "until it has more than N / this many requests more");
ABSL_FLAG(double, prefix_routing_tier_credit, 0.75,
          "With --routing_policy=prefix: what a prompt token a worker would load from its KV "
          "tier is worth against one in its block pool, in [0, 1] (0: tiers do not count)");
ABSL_FLAG(int, max_inflight, 4096,
          "Requests served at once; more wait in the router's queue (--max_queued), larger "
          "priority first");
ABSL_FLAG(int, max_queued, 4096,
          "Requests that may wait for a serving slot; more are refused at once with "
          "RESOURCE_EXHAUSTED (0 = refuse at once above --max_inflight)");
ABSL_FLAG(absl::Duration, queue_timeout, absl::Seconds(30),
          "Longest wait in the router's queue, and from arrival for a decode worker with room "
          "when every one is full; then the request is refused with RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, large_prepare_bytes, 64 << 10,
          "Requests whose prompt holds more bytes are validated and tokenized on threads of "
          "their own (--large_prepare_threads), so that huge prompts never delay small ones; "
          "0 = one set of threads for all");
ABSL_FLAG(int, large_prepare_threads, 1,
          "Threads that prepare the prompts above --large_prepare_bytes");
ABSL_FLAG(absl::Duration, request_timeout, absl::Seconds(300),
          "Whole-request time limit when the client sets no timeout_ms (the gRPC deadline "
          "still applies)");
ABSL_FLAG(absl::Duration, reserve_timeout, absl::Seconds(2),
          "How long a decode worker may take to reserve KV for a request; then the "
          "reservation is cancelled and the request goes to another decode worker (a hung "
          "worker costs a request this much)");
ABSL_FLAG(int32_t, max_migrations, 2,
          "How many times one request's stream may move to another decode worker after its "
          "worker is lost mid-stream (the new worker computes the prompt and the tokens sent so "
          "far, and the stream goes on where it was); 0 = a lost worker fails its streams");
ABSL_FLAG(bool, kv_handoff, true,
          "A one-choice stream that a draining decode worker offers moves with its K/V (the "
          "draining worker ships it to the new one) instead of being recomputed there");
ABSL_FLAG(absl::Duration, handoff_timeout, absl::Seconds(10),
          "How long a draining decode worker may take to ship a moving stream's K/V before the "
          "new worker recomputes the stream instead");
ABSL_FLAG(absl::Duration, decode_stall_timeout, absl::Seconds(2),
          "A stream that gets no token for this long while other streams' tokens keep coming "
          "(its decode worker answers health polls but does not decode it) moves to another "
          "decode worker as a lost one does; stretched to 8 of the stream's own gaps between "
          "tokens on slow workers; 0 = never");
ABSL_FLAG(absl::Duration, prefill_answer_timeout, absl::Seconds(2),
          "How long a prefill worker may take to answer, per 1024 prompt tokens and per "
          "request the router already has open on it (the answer comes once the KV has "
          "shipped); then the request is retried on another prefill worker. Raise it if "
          "long prompts under load time out");
ABSL_FLAG(absl::Duration, resolve_interval, absl::Seconds(5),
          "How often worker DNS names are resolved and file: targets read again (workers join "
          "and leave)");
ABSL_FLAG(absl::Duration, health_interval, absl::Milliseconds(500),
          "How often every worker is polled with GetStats (health and load)");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(30),
          "On SIGTERM/SIGINT, how long in-flight requests may run before they are cancelled");
ABSL_FLAG(std::string, request_log, "",
          "Append one JSON line per finished request (id, status, tokens, timeline, workers, "
          "routing reason) to this file; empty = write it to the INFO log (stderr)");
ABSL_FLAG(std::string, http_listen, "",
          "host:port of the OpenAI-compatible HTTP API (POST /v1/completions, "
          "/v1/chat/completions, /tokenize, /detokenize; GET /v1/models[/ID], /version, "
          "/health); port 0 picks a free one; empty = no HTTP API");
ABSL_FLAG(std::string, http_port_file, "",
          "Write the bound HTTP port here (one line) once it is up; empty = don't");
ABSL_FLAG(std::string, served_model_name, "",
          "Model id of the HTTP API (/v1/models, responses); empty = the name of --model's "
          "folder, else of --tokenizer");
ABSL_FLAG(std::string, model_name, "", "Deprecated alias of --served_model_name");
ABSL_FLAG(int, http_io_threads, 2, "Threads running the HTTP server's io loop (all connections)");
ABSL_FLAG(int, http_max_connections, 16384,
          "Open HTTP connections; beyond it a new connection is closed at once");
ABSL_FLAG(int64_t, http_max_body_bytes, 16 << 20, "Largest HTTP request body (413 above it)");
ABSL_FLAG(absl::Duration, http_header_timeout, absl::Seconds(10),
          "Time a client has to send a request's header (408 and closed after it)");
ABSL_FLAG(absl::Duration, http_body_timeout, absl::Seconds(30),
          "Time a client has to send a request's body once the header is in");
ABSL_FLAG(absl::Duration, http_idle_timeout, absl::Seconds(60),
          "A keep-alive connection with no request under way is closed after this long");
ABSL_FLAG(std::string, allowed_origins, "",
          "CORS: comma-separated origins browsers may call the HTTP API from ('*' = any); "
          "empty = no CORS headers");
ABSL_FLAG(std::vector<std::string>, api_key, {},
          "API keys clients must present (HTTP: 'Authorization: Bearer KEY'; gRPC: the "
          "'authorization' metadata, same form), comma-separated; with --api_key_file too, "
          "both count. Empty with no file = no key needed");
ABSL_FLAG(std::string, api_key_file, "", "A file of API keys, one per line ('#' starts a comment)");
ABSL_FLAG(std::string, worker_tls_ca, "",
          "PEM CA the workers' certificates must chain to: the router dials its workers over "
          "TLS (empty with no --worker_tls_cert = plain gRPC)");
ABSL_FLAG(std::string, worker_tls_cert, "",
          "PEM client certificate the router presents to workers started with "
          "--tls_client_ca (mutual TLS)");
ABSL_FLAG(std::string, worker_tls_key, "", "PEM private key of --worker_tls_cert");
ABSL_FLAG(absl::Duration, startup_timeout, absl::Seconds(60),
          "How long to wait at start for a healthy decode worker before giving up");

namespace tandem {
namespace {

// What GET /version answers.
constexpr char kVersion[] = "0.12.0";

std::vector<std::string> SplitTargets(const std::string& flag) {
  return absl::StrSplit(flag, ',', absl::SkipWhitespace());
}

// --served_model_name, or its deprecated alias --model_name, or the name of
// --model, else of --tokenizer.
absl::StatusOr<std::string> RouterServedModelName() {
  const std::string model = absl::GetFlag(FLAGS_model);
  return ServedModelName(absl::GetFlag(FLAGS_served_model_name), absl::GetFlag(FLAGS_model_name),
                         model.empty() ? absl::GetFlag(FLAGS_tokenizer) : model);
}

// Waits until a decode worker is routable. Gives up early when every decode
// worker has answered and none agrees with the pool or the router's
// tokenizer (a configuration error that waiting does not fix), naming what
// differs.
absl::Status WaitForDecodeWorker(const router::WorkerRegistry& registry,
                                 absl::Duration startup_timeout) {
  const absl::Time deadline = absl::Now() + startup_timeout;
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    if (registry.WaitForRoutable(router::WorkerRole::kDecode, std::min(left, absl::Seconds(1)))) {
      return absl::OkStatus();
    }
    // Termination signals stay blocked (and pending) until the server runs:
    // one that came meanwhile ends the start-up (a pod deleted before any
    // decode worker was ready).
    if (const int sig = rpc::WaitForSignal(absl::ZeroDuration()); sig != 0) {
      return absl::CancelledError(
          absl::StrCat("signal ", sig, " while waiting for a healthy decode worker"));
    }
    std::vector<std::string> refused;
    bool all_answered = true;
    for (const router::WorkerSnapshot& s : registry.Snapshot(router::WorkerRole::kDecode)) {
      if (!s.healthy || s.disagreement.empty()) {
        all_answered = false;
        break;
      }
      refused.push_back(absl::StrCat(s.address, " ", s.disagreement));
    }
    if (all_answered && !refused.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "no decode worker agrees with the pool or this router's tokenizer: ",
          absl::StrJoin(refused, "; "),
          ". Start every worker with the same --model, --kv_dtype and --block_size, and the "
          "router with that model's --model or --tokenizer"));
    }
    if (absl::Now() >= deadline) {
      return absl::UnavailableError(absl::StrCat(
          "no decode worker of --decode_workers=", absl::GetFlag(FLAGS_decode_workers),
          " became healthy within --startup_timeout=", absl::FormatDuration(startup_timeout),
          "; check that they run and are reachable"));
    }
  }
}

// The template of chat prompts: that of --model's folder (or of --tokenizer
// when it is a folder); with only a tokenizer file, the plain default
// template without special tokens, whose prompts the tokenizer gives its BOS
// (request_validation.h).
absl::StatusOr<ChatTemplate> LoadChatTemplate(const std::string& model_path,
                                              const std::string& tokenizer_path) {
  std::error_code ec;
  const std::string dir = !model_path.empty() ? model_path : tokenizer_path;
  if (std::filesystem::is_directory(dir, ec)) return ChatTemplate::FromModelDir(dir);
  return ChatTemplate::FromString(kDefaultChatTemplate, std::nullopt, std::nullopt);
}

absl::Status Run() {
  const std::string model_path = absl::GetFlag(FLAGS_model);
  std::string tokenizer_path = absl::GetFlag(FLAGS_tokenizer);
  if (tokenizer_path.empty()) tokenizer_path = model_path;
  if (tokenizer_path.empty()) {
    return absl::InvalidArgumentError(
        "--model (a Hugging Face folder) or --tokenizer is required (see --help)");
  }
  ASSIGN_OR_RETURN(const std::string served_model_name, RouterServedModelName());
  ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, LoadTokenizer(tokenizer_path));
  ASSIGN_OR_RETURN(const ChatTemplate chat_template, LoadChatTemplate(model_path, tokenizer_path));
  if (absl::GetFlag(FLAGS_max_inflight) < 1) {
    return absl::InvalidArgumentError("--max_inflight must be at least 1");
  }
  if (absl::GetFlag(FLAGS_max_queued) < 0) {
    return absl::InvalidArgumentError("--max_queued must be >= 0");
  }
  if (absl::GetFlag(FLAGS_large_prepare_bytes) < 0) {
    return absl::InvalidArgumentError("--large_prepare_bytes must be >= 0 (0: one lane)");
  }
  if (absl::GetFlag(FLAGS_large_prepare_threads) < 1) {
    return absl::InvalidArgumentError("--large_prepare_threads must be at least 1");
  }
  if (absl::GetFlag(FLAGS_queue_timeout) <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--queue_timeout must be positive, e.g. 30s");
  }
  if (absl::GetFlag(FLAGS_prefill_burst_queue) < 0) {
    return absl::InvalidArgumentError("--prefill_burst_queue must be >= 0 (0: off)");
  }
  if (absl::GetFlag(FLAGS_local_prefill_tokens) < 0) {
    return absl::InvalidArgumentError("--local_prefill_tokens must be >= 0");
  }
  const std::string routing_policy = absl::GetFlag(FLAGS_routing_policy);
  if (routing_policy != "prefix" && routing_policy != "load") {
    return absl::InvalidArgumentError(
        absl::StrCat("--routing_policy is '", routing_policy, "'; it must be 'prefix' or 'load'"));
  }
  if (absl::GetFlag(FLAGS_prefix_routing_load_tokens) < 0) {
    return absl::InvalidArgumentError("--prefix_routing_load_tokens must be >= 0");
  }
  if (const double credit = absl::GetFlag(FLAGS_prefix_routing_tier_credit);
      !(credit >= 0 && credit <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--prefix_routing_tier_credit is ", credit, "; it must be in [0, 1]"));
  }
  if (absl::GetFlag(FLAGS_request_timeout) <= absl::ZeroDuration() ||
      absl::GetFlag(FLAGS_health_interval) <= absl::ZeroDuration() ||
      absl::GetFlag(FLAGS_resolve_interval) <= absl::ZeroDuration() ||
      absl::GetFlag(FLAGS_reserve_timeout) <= absl::ZeroDuration() ||
      absl::GetFlag(FLAGS_prefill_answer_timeout) <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "--request_timeout, --health_interval, --resolve_interval, --reserve_timeout and "
        "--prefill_answer_timeout must be positive");
  }
  if (absl::GetFlag(FLAGS_decode_stall_timeout) < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--decode_stall_timeout must be >= 0 (0 = off)");
  }
  if (absl::GetFlag(FLAGS_handoff_timeout) <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--handoff_timeout must be positive");
  }
  if (absl::GetFlag(FLAGS_max_migrations) < 0 || absl::GetFlag(FLAGS_max_migrations) > 100) {
    return absl::InvalidArgumentError("--max_migrations must be 0 to 100");
  }

  if (const std::string listen = absl::GetFlag(FLAGS_http_listen); !listen.empty()) {
    std::string host;
    int port = 0;
    RETURN_IF_ERROR(http::ParseListenAddress(listen, &host, &port));
  }
  if (absl::GetFlag(FLAGS_http_io_threads) < 1 || absl::GetFlag(FLAGS_http_max_connections) < 1 ||
      absl::GetFlag(FLAGS_http_max_body_bytes) < 1) {
    return absl::InvalidArgumentError(
        "--http_io_threads, --http_max_connections and --http_max_body_bytes must be positive");
  }
  ASSIGN_OR_RETURN(
      router::ApiKeys api_keys,
      router::ApiKeys::Create(absl::GetFlag(FLAGS_api_key), absl::GetFlag(FLAGS_api_key_file)));
  // --tls_cert and --tls_key serve both listeners over TLS; --tls_client_ca
  // makes gRPC clients present a certificate.
  const rpc::TlsConfig listener_tls = rpc::ServerTlsFromFlags();
  rpc::TlsConfig worker_tls;
  worker_tls.cert_file = absl::GetFlag(FLAGS_worker_tls_cert);
  worker_tls.key_file = absl::GetFlag(FLAGS_worker_tls_key);
  worker_tls.ca_file = absl::GetFlag(FLAGS_worker_tls_ca);
  worker_tls.flags = rpc::WorkerClientTlsFlags();
  // Bad TLS files are a start-up error before anything listens.
  RETURN_IF_ERROR(rpc::MakeServerCredentials(listener_tls).status());

  auto registry_metrics = std::make_shared<prometheus::Registry>();
  router::RouterMetrics router_metrics(*registry_metrics);
  router::RegistryOptions registry_options;
  registry_options.on_poll_round = [&router_metrics](int prefill, int decode) {
    router_metrics.prefill_workers_ready.Set(prefill);
    router_metrics.decode_workers_ready.Set(decode);
  };
  registry_options.prefill_targets = SplitTargets(absl::GetFlag(FLAGS_prefill_workers));
  registry_options.decode_targets = SplitTargets(absl::GetFlag(FLAGS_decode_workers));
  registry_options.resolve_interval = absl::GetFlag(FLAGS_resolve_interval);
  registry_options.health_interval = absl::GetFlag(FLAGS_health_interval);
  registry_options.tokenizer_vocab_size = tokenizer->vocab_size();
  ASSIGN_OR_RETURN(registry_options.channels, router::GrpcWorkerChannels(worker_tls));
  ASSIGN_OR_RETURN(std::unique_ptr<router::WorkerRegistry> registry,
                   router::WorkerRegistry::Create(registry_options));

  const absl::Duration startup_timeout = absl::GetFlag(FLAGS_startup_timeout);
  LOG(INFO) << "serving " << served_model_name << " (tokenizer " << tokenizer_path << ", "
            << tokenizer->vocab_size() << " tokens, "
            << (chat_template.is_default() ? "default" : "the model's")
            << " chat template); waiting up to " << startup_timeout
            << " for a healthy decode worker";
  RETURN_IF_ERROR(WaitForDecodeWorker(*registry, startup_timeout));

  ASSIGN_OR_RETURN(std::unique_ptr<metrics::MetricsServer> metrics_server,
                   metrics::StartMetricsServerFromFlags(registry_metrics));
  std::unique_ptr<router::RequestLog> request_log;
  if (const std::string path = absl::GetFlag(FLAGS_request_log); !path.empty()) {
    ASSIGN_OR_RETURN(request_log, router::RequestLog::Open(path));
  }

  router::RouterCoreOptions options;
  options.driver.metrics = &router_metrics;
  options.driver.request_log = request_log.get();
  options.driver.local_prefill_tokens = absl::GetFlag(FLAGS_local_prefill_tokens);
  options.driver.prefill_burst_queue = absl::GetFlag(FLAGS_prefill_burst_queue);
  options.driver.request_timeout = absl::GetFlag(FLAGS_request_timeout);
  options.driver.reserve_timeout = absl::GetFlag(FLAGS_reserve_timeout);
  options.driver.prefill_answer_timeout = absl::GetFlag(FLAGS_prefill_answer_timeout);
  options.driver.max_migrations = absl::GetFlag(FLAGS_max_migrations);
  options.driver.decode_stall_timeout = absl::GetFlag(FLAGS_decode_stall_timeout);
  options.driver.kv_handoff = absl::GetFlag(FLAGS_kv_handoff);
  options.driver.handoff_timeout = absl::GetFlag(FLAGS_handoff_timeout);
  if (routing_policy == "prefix") {
    const router::PrefixRoutingOptions prefix_options{
        .load_tokens = absl::GetFlag(FLAGS_prefix_routing_load_tokens),
        .tier_credit = absl::GetFlag(FLAGS_prefix_routing_tier_credit)};
    options.driver.prefix_router = std::make_shared<router::PrefixRouter>(prefix_options);
  }
  options.max_inflight = absl::GetFlag(FLAGS_max_inflight);
  options.max_queued = absl::GetFlag(FLAGS_max_queued);
  options.queue_timeout = absl::GetFlag(FLAGS_queue_timeout);
  options.served_model_name = served_model_name;
  // Request preparation, the HTTP API's heavy handlers and the core's
  // timers run here, never on a network thread.
  auto executor = std::make_unique<ThreadPoolExecutor>(options.prepare_threads);
  options.executor = executor.get();
  // Large prompts' preparation, apart (declared before the core: outlives it).
  std::unique_ptr<ThreadPoolExecutor> large_executor;
  options.large_prepare_bytes = absl::GetFlag(FLAGS_large_prepare_bytes);
  if (options.large_prepare_bytes > 0) {
    large_executor =
        std::make_unique<ThreadPoolExecutor>(absl::GetFlag(FLAGS_large_prepare_threads));
    options.large_executor = large_executor.get();
  }
  auto core = std::make_unique<router::RouterCore>(registry.get(), tokenizer.get(), &chat_template,
                                                   options);
  router::Authorizer authorize;
  if (api_keys.enabled()) {
    authorize = [&api_keys](const grpc::CallbackServerContext& context) {
      return rpc::CheckBearerKey(context, [&api_keys](std::string_view key) {
        return api_keys.Check(absl::string_view(key.data(), key.size()));
      });
    };
  }
  auto service = std::make_unique<router::RouterService>(core.get(), authorize);
  ASSIGN_OR_RETURN(rpc::RunningServer server,
                   rpc::StartServer({.address = absl::GetFlag(FLAGS_listen), .tls = listener_tls},
                                    {service.get()}));
  if (const std::string path = absl::GetFlag(FLAGS_port_file); !path.empty()) {
    if (absl::Status s = WritePortFile(path, server.port, "port_file"); !s.ok()) {
      server.server->Shutdown();
      return s;
    }
  }
  LOG(INFO) << "tandem-router serving on port " << server.port
            << (listener_tls.enabled() ? " (TLS)" : "")
            << (api_keys.enabled() ? absl::StrCat(", ", api_keys.size(), " API keys") : "");

  // The HTTP API calls the same core.
  router::OpenAiRoutes routes(
      core.get(), api_keys,
      {.allowed_origins = SplitTargets(absl::GetFlag(FLAGS_allowed_origins)),
       .version = kVersion,
       .executor = executor.get(),
       .large_executor = large_executor.get()});
  std::unique_ptr<router::HttpServer> http;
  if (const std::string listen = absl::GetFlag(FLAGS_http_listen); !listen.empty()) {
    router::HttpServerOptions http_options{
        .listen = listen,
        .io_threads = absl::GetFlag(FLAGS_http_io_threads),
        .max_connections = absl::GetFlag(FLAGS_http_max_connections),
        .max_body_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_http_max_body_bytes)),
        .header_timeout = absl::GetFlag(FLAGS_http_header_timeout),
        .body_timeout = absl::GetFlag(FLAGS_http_body_timeout),
        .idle_timeout = absl::GetFlag(FLAGS_http_idle_timeout),
        .tls_cert_file = listener_tls.cert_file,
        .tls_key_file = listener_tls.key_file};
    absl::StatusOr<std::unique_ptr<router::HttpServer>> started =
        router::HttpServer::Start(http_options, routes.Handler());
    absl::Status s = started.status();
    if (s.ok()) {
      http = *std::move(started);
      if (const std::string path = absl::GetFlag(FLAGS_http_port_file); !path.empty()) {
        s = WritePortFile(path, http->port(), "http_port_file");
      }
    }
    if (!s.ok()) {
      http.reset();
      server.server->Shutdown();
      return s;
    }
    LOG(INFO) << "OpenAI-compatible HTTP API on port " << http->port()
              << (http->tls() ? " (TLS)" : "") << " (model " << served_model_name << ")";
  }

  // gRPC health follows the pool: tandem.v1.Router is NOT_SERVING while no
  // decode worker is routable (/health answers 503 from the same test).
  int sig = 0;
  bool serving = true;
  while ((sig = rpc::WaitForSignal(absl::GetFlag(FLAGS_health_interval))) == 0) {
    if (const bool now = core->Serving(); now != serving) {
      serving = now;
      server.SetServing(std::string(v1::Router::service_full_name()), serving);
      LOG(WARNING) << (serving ? "a decode worker is routable again: serving"
                               : "no routable decode worker: health is NOT_SERVING");
    }
  }
  const absl::Duration drain_timeout = absl::GetFlag(FLAGS_drain_timeout);
  LOG(INFO) << "signal " << sig << ": draining (up to " << drain_timeout << ")";
  server.SetServing(false);
  core->StartDraining();
  if (!core->WaitForIdle(drain_timeout)) {
    LOG(WARNING) << core->inflight() << " requests still running after --drain_timeout; "
                 << "cancelling them";
    core->CancelAll();
    core->WaitForIdle(absl::Seconds(5));
  }
  // Every request has ended: stopping the HTTP server now cuts no response
  // but the last writes, which get a short grace.
  if (http != nullptr) http->Stop(absl::Seconds(2));
  server.server->Shutdown(rpc::ToChrono(absl::Now() + absl::Seconds(5)));
  service.reset();
  core.reset();
  executor.reset();  // Runs what is left (the routes outlive it) and joins.
  registry->Stop();
  LOG(INFO) << "tandem-router stopped";
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  // Debian's Abseil is built with its mutex deadlock detector on, which
  // tracks every lock in a global graph; the tests keep it, the server does
  // not pay for it on every request.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  tandem::rpc::BlockTerminationSignals();
  tandem::ParseToolFlags(
      argc, argv,
      "The tandem router: serves tandem.v1.Router over the prefill and decode pools.\n"
      "Usage: tandem-router --decode_workers HOST:PORT[,...] [--prefill_workers HOST:PORT[,...]]\n"
      "       --model DIR | --tokenizer FILE [--listen HOST:PORT --port_file FILE]\n"
      "       [--http_listen HOST:PORT --http_port_file FILE --served_model_name NAME]\n"
      "       [--metrics_listen HOST:PORT --metrics_port_file FILE] [--request_log FILE]");
  if (absl::Status s = tandem::Run(); absl::IsCancelled(s)) {
    std::cerr << "tandem-router: " << s.message() << "; exiting\n";
  } else if (!s.ok()) {
    std::cerr << "tandem-router: " << s.message() << "\n";
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
