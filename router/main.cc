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
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/flags.h"
#include "common/base/logging.h"
#include "common/base/port_file.h"
#include "common/base/status_macros.h"
#include "common/metrics/metrics_server.h"
#include "common/model/chat_template.h"
#include "common/model/served_model.h"
#include "common/model/tokenizer.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/server.h"
#include "router/openai_http.h"
#include "router/router_metrics.h"
#include "router/router_core.h"
#include "router/router_service.h"
#include "router/worker_registry.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:8100", "host:port to serve on; port 0 picks a free one");
ABSL_FLAG(std::string, port_file, "",
          "Write the bound port here (one line) once the server is up; empty = don't");
ABSL_FLAG(std::string, prefill_workers, "",
          "Prefill workers, comma-separated host:port; a DNS name stands for every address it "
          "resolves to. Empty = colocated mode (decode workers prefill locally)");
ABSL_FLAG(std::string, decode_workers, "",
          "Decode workers, comma-separated host:port (required); DNS names as for "
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
ABSL_FLAG(int, local_prefill_tokens, 0,
          "Prompts of at most this many tokens are prefilled on the decode worker (conditional "
          "disaggregation); 0 = always use a prefill worker when one is healthy");
ABSL_FLAG(int, max_inflight, 256,
          "Requests served at once; more are refused at once with RESOURCE_EXHAUSTED");
ABSL_FLAG(absl::Duration, request_timeout, absl::Seconds(300),
          "Whole-request time limit when the client sets no timeout_ms (the gRPC deadline "
          "still applies)");
ABSL_FLAG(absl::Duration, resolve_interval, absl::Seconds(5),
          "How often worker DNS names are resolved again (workers join and leave)");
ABSL_FLAG(absl::Duration, health_interval, absl::Milliseconds(500),
          "How often every worker is polled with GetStats (health and load)");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(30),
          "On SIGTERM/SIGINT, how long in-flight requests may run before they are cancelled");
ABSL_FLAG(std::string, request_log, "",
          "Append one JSON line per finished request (id, status, tokens, timeline, workers, "
          "routing reason) to this file; empty = write it to the INFO log (stderr)");
ABSL_FLAG(std::string, http_listen, "",
          "host:port of the OpenAI-compatible HTTP API (POST /v1/completions, POST "
          "/v1/chat/completions, GET /v1/models, "
          "GET /health); port 0 picks a free one; empty = no HTTP API");
ABSL_FLAG(std::string, http_port_file, "",
          "Write the bound HTTP port here (one line) once it is up; empty = don't");
ABSL_FLAG(std::string, served_model_name, "",
          "Model id of the HTTP API (/v1/models, responses); empty = the name of --model's "
          "folder, else of --tokenizer");
ABSL_FLAG(std::string, model_name, "", "Deprecated alias of --served_model_name");
ABSL_FLAG(int, http_threads, 0,
          "HTTP connections served at once (each open response, and each idle keep-alive "
          "connection for up to 5 s, holds one; more wait in a queue); 0 = --max_inflight + 16");
ABSL_FLAG(absl::Duration, startup_timeout, absl::Seconds(60),
          "How long to wait at start for a healthy decode worker before giving up");

namespace tandem {
namespace {

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
  if (absl::GetFlag(FLAGS_local_prefill_tokens) < 0) {
    return absl::InvalidArgumentError("--local_prefill_tokens must be >= 0");
  }
  if (absl::GetFlag(FLAGS_request_timeout) <= absl::ZeroDuration() ||
      absl::GetFlag(FLAGS_health_interval) <= absl::ZeroDuration() ||
      absl::GetFlag(FLAGS_resolve_interval) <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "--request_timeout, --health_interval and --resolve_interval must be positive");
  }

  if (const std::string listen = absl::GetFlag(FLAGS_http_listen); !listen.empty()) {
    std::string host;
    int port = 0;
    RETURN_IF_ERROR(router::SplitHostPort(listen, &host, &port));
  }
  if (absl::GetFlag(FLAGS_http_threads) < 0) {
    return absl::InvalidArgumentError("--http_threads must be >= 0 (0 = --max_inflight + 16)");
  }

  router::RegistryOptions registry_options;
  registry_options.prefill_targets = SplitTargets(absl::GetFlag(FLAGS_prefill_workers));
  registry_options.decode_targets = SplitTargets(absl::GetFlag(FLAGS_decode_workers));
  registry_options.resolve_interval = absl::GetFlag(FLAGS_resolve_interval);
  registry_options.health_interval = absl::GetFlag(FLAGS_health_interval);
  registry_options.tokenizer_vocab_size = tokenizer->vocab_size();
  ASSIGN_OR_RETURN(std::unique_ptr<router::WorkerRegistry> registry,
                   router::WorkerRegistry::Create(registry_options));

  const absl::Duration startup_timeout = absl::GetFlag(FLAGS_startup_timeout);
  LOG(INFO) << "serving " << served_model_name << " (tokenizer " << tokenizer_path << ", "
            << tokenizer->vocab_size() << " tokens, "
            << (chat_template.is_default() ? "default" : "the model's")
            << " chat template); waiting up to " << startup_timeout
            << " for a healthy decode worker";
  RETURN_IF_ERROR(WaitForDecodeWorker(*registry, startup_timeout));

  auto registry_metrics = std::make_shared<prometheus::Registry>();
  router::RouterMetrics router_metrics(*registry_metrics);
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
  options.driver.request_timeout = absl::GetFlag(FLAGS_request_timeout);
  options.max_inflight = absl::GetFlag(FLAGS_max_inflight);
  options.served_model_name = served_model_name;
  auto core = std::make_unique<router::RouterCore>(registry.get(), tokenizer.get(), &chat_template,
                                                   options);
  auto service = std::make_unique<router::RouterService>(core.get());
  ASSIGN_OR_RETURN(rpc::RunningServer server,
                   rpc::StartServer({.address = absl::GetFlag(FLAGS_listen)}, {service.get()}));
  if (const std::string path = absl::GetFlag(FLAGS_port_file); !path.empty()) {
    if (absl::Status s = WritePortFile(path, server.port, "port_file"); !s.ok()) {
      server.server->Shutdown();
      return s;
    }
  }
  LOG(INFO) << "tandem-router serving on port " << server.port;

  // The HTTP API calls the gRPC service above through an in-process channel.
  std::unique_ptr<router::OpenAiHttpServer> http;
  if (const std::string listen = absl::GetFlag(FLAGS_http_listen); !listen.empty()) {
    router::OpenAiHttpOptions http_options;
    http_options.listen = listen;
    http_options.served_model_name = served_model_name;
    http_options.request_timeout = absl::GetFlag(FLAGS_request_timeout);
    http_options.threads = absl::GetFlag(FLAGS_http_threads);
    if (http_options.threads == 0) http_options.threads = options.max_inflight + 16;
    absl::StatusOr<std::unique_ptr<router::OpenAiHttpServer>> started =
        router::OpenAiHttpServer::Start(server.server->InProcessChannel(grpc::ChannelArguments()),
                                        http_options);
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
    LOG(INFO) << "OpenAI-compatible HTTP API on port " << http->port() << " (model "
              << http_options.served_model_name << ")";
  }

  const int sig = rpc::WaitForTerminationSignal();
  const absl::Duration drain_timeout = absl::GetFlag(FLAGS_drain_timeout);
  LOG(INFO) << "signal " << sig << ": draining (up to " << drain_timeout << ")";
  server.SetServing(false);
  if (http != nullptr) http->SetServing(false);
  core->StartDraining();
  if (!core->WaitForIdle(drain_timeout)) {
    LOG(WARNING) << core->inflight() << " requests still running after --drain_timeout; "
                 << "cancelling them";
    core->CancelAll();
    core->WaitForIdle(absl::Seconds(5));
  }
  // Every HTTP call went through the drained service: stopping the HTTP
  // server now cuts no response.
  if (http != nullptr) http->Stop();
  server.server->Shutdown(rpc::ToChrono(absl::Now() + absl::Seconds(5)));
  service.reset();
  core.reset();
  registry->Stop();
  LOG(INFO) << "tandem-router stopped";
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  tandem::rpc::BlockTerminationSignals();
  tandem::ParseToolFlags(
      argc, argv,
      "The tandem router: serves tandem.v1.Router over the prefill and decode pools.\n"
      "Usage: tandem-router --decode_workers HOST:PORT[,...] [--prefill_workers HOST:PORT[,...]]\n"
      "       --model DIR | --tokenizer FILE [--listen HOST:PORT --port_file FILE]\n"
      "       [--http_listen HOST:PORT --http_port_file FILE --served_model_name NAME]\n"
      "       [--metrics_listen HOST:PORT --metrics_port_file FILE] [--request_log FILE]");
  if (absl::Status s = tandem::Run(); !s.ok()) {
    std::cerr << "tandem-router: " << s.message() << "\n";
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
