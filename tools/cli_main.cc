// tandem-cli: a command-line client of the tandem router.
//   tandem-cli generate --router HOST:PORT --prompt TEXT --max-tokens N [...]
// Only the generated text goes to stdout, as it arrives; a one-line summary
// goes to stderr.
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/flags.h"
#include "common/rpc/auth.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/server.h"
#include "common/rpc/tls.h"
#include "tandem/v1/generate.grpc.pb.h"

ABSL_FLAG(std::string, router, "127.0.0.1:8100", "The router's host:port");
ABSL_FLAG(std::string, prompt, "", "Prompt text (required)");
ABSL_FLAG(int, max_tokens, 128, "Most tokens to generate (>= 1)");
ABSL_FLAG(float, temperature, 0.0f, "Sampling temperature; 0 = greedy");
ABSL_FLAG(int, top_k, 0, "Sample among the k most likely tokens; 0 = no limit");
ABSL_FLAG(float, top_p, 1.0f, "Nucleus sampling mass in (0, 1]; 1 = no cut");
ABSL_FLAG(float, min_p, 0.0f, "Drop tokens below min_p times the top one's probability; 0 = off");
ABSL_FLAG(uint64_t, seed, 0, "Random seed; the same seed gives the same tokens");
ABSL_FLAG(std::string, stop, "", "Stop generating when the text contains this; empty = none");
ABSL_FLAG(int64_t, timeout_ms, 0, "Whole-request time limit in ms; 0 = the router's default");
ABSL_FLAG(bool, chat, false,
          "Send --prompt as one user message, rendered by the served model's chat template");
ABSL_FLAG(std::string, system, "", "With --chat: a system message before the user message");
ABSL_FLAG(std::string, request_id, "", "Request id for the logs; empty = the router makes one");
ABSL_FLAG(std::string, api_key, "",
          "API key of a router started with --api_key (sent as 'authorization: Bearer KEY'); "
          "empty = none");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA the router's certificate must chain to: dial a router started with "
          "--tls_cert over TLS; empty = plain gRPC");

namespace tandem {
namespace {

constexpr char kUsage[] =
    "A client of the tandem router.\n"
    "Usage: tandem-cli generate --router HOST:PORT --prompt TEXT --max-tokens N\n"
    "       [--chat [--system TEXT]]\n"
    "       [--temperature T --top-k K --top-p P --seed S --stop STR --timeout_ms MS]\n"
    "       [--api_key KEY] [--tls_ca CA.pem]\n"
    "Streams the continuation to stdout and a summary to stderr.";

int Generate() {
  v1::GenerateRequest request;
  request.set_request_id(absl::GetFlag(FLAGS_request_id));
  if (absl::GetFlag(FLAGS_chat)) {
    v1::ChatMessages* messages = request.mutable_messages();
    if (const std::string system = absl::GetFlag(FLAGS_system); !system.empty()) {
      v1::ChatMessage* m = messages->add_messages();
      m->set_role("system");
      m->set_content(system);
    }
    v1::ChatMessage* m = messages->add_messages();
    m->set_role("user");
    m->set_content(absl::GetFlag(FLAGS_prompt));
  } else if (!absl::GetFlag(FLAGS_system).empty()) {
    std::cerr << "tandem-cli: --system needs --chat\n";
    return 2;
  } else {
    request.set_text(absl::GetFlag(FLAGS_prompt));
  }
  request.set_max_tokens(absl::GetFlag(FLAGS_max_tokens));
  request.mutable_sampling()->set_temperature(absl::GetFlag(FLAGS_temperature));
  request.mutable_sampling()->set_top_k(absl::GetFlag(FLAGS_top_k));
  request.mutable_sampling()->set_top_p(absl::GetFlag(FLAGS_top_p));
  request.mutable_sampling()->set_min_p(absl::GetFlag(FLAGS_min_p));
  request.mutable_sampling()->set_seed(absl::GetFlag(FLAGS_seed));
  if (const std::string stop = absl::GetFlag(FLAGS_stop); !stop.empty()) request.add_stop(stop);
  request.set_timeout_ms(absl::GetFlag(FLAGS_timeout_ms));

  rpc::TlsConfig tls;
  tls.ca_file = absl::GetFlag(FLAGS_tls_ca);
  tls.flags.ca = "--tls_ca";
  const absl::StatusOr<rpc::ChannelSecurity> security = rpc::MakeChannelSecurity(tls);
  if (!security.ok()) {
    std::cerr << "tandem-cli: " << security.status().message() << "\n";
    return 2;
  }
  auto stub = v1::Router::NewStub(rpc::MakeChannel(absl::GetFlag(FLAGS_router), *security));
  grpc::ClientContext ctx;
  if (const std::string key = absl::GetFlag(FLAGS_api_key); !key.empty()) {
    rpc::AttachBearerKey(ctx, key);
  }
  // The router bounds the request itself; this only guards a router that
  // never answers.
  const int64_t timeout_ms = absl::GetFlag(FLAGS_timeout_ms);
  ctx.set_deadline(rpc::ToChrono(
      absl::Now() +
      (timeout_ms > 0 ? absl::Milliseconds(timeout_ms) + absl::Seconds(5) : absl::Minutes(10))));
  const absl::Time start = absl::Now();
  absl::Time first_token = absl::InfinitePast();
  absl::Time last_token = start;
  int tokens = 0;
  v1::Finished finished;
  auto reader = stub->Generate(&ctx, request);
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
    if (response.token_ids_size() > 0) {
      if (tokens == 0) first_token = absl::Now();
      last_token = absl::Now();
      tokens += response.token_ids_size();
    }
    if (!response.text().empty()) {
      std::fwrite(response.text().data(), 1, response.text().size(), stdout);
      std::fflush(stdout);
    }
    if (response.has_finished()) finished = response.finished();
  }
  const grpc::Status status = reader->Finish();
  std::fflush(stdout);
  if (!status.ok()) {
    std::cerr << "\ntandem-cli: " << absl::StatusCodeToString(rpc::FromGrpc(status).code()) << ": "
              << status.error_message() << "\n";
    return 1;
  }
  const double ttft_ms = tokens > 0 ? absl::ToDoubleMilliseconds(first_token - start) : 0.0;
  const double decode_s = absl::ToDoubleSeconds(last_token - first_token);
  const double decode_tps = tokens > 1 && decode_s > 0 ? (tokens - 1) / decode_s : 0.0;
  std::string reason = v1::FinishReason_Name(finished.reason());
  if (reason.rfind("FINISH_REASON_", 0) == 0) reason = reason.substr(strlen("FINISH_REASON_"));
  std::cerr << absl::StrFormat(
      "\n[tandem-cli] finish %s | prompt %d tokens, completion %d | TTFT %.2f ms | decode "
      "%.1f tok/s | prefill %s, decode %s (%s)\n",
      reason, finished.usage().prompt_tokens(), finished.usage().completion_tokens(), ttft_ms,
      decode_tps, finished.prefill_worker().empty() ? "-" : finished.prefill_worker(),
      finished.decode_worker().empty() ? "-" : finished.decode_worker(),
      finished.disaggregated() ? "disaggregated" : "local prefill");
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "generate") != 0) {
    const bool help =
        argc >= 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0 ||
                      std::strcmp(argv[1], "help") == 0);
    std::fprintf(help ? stdout : stderr, "%s\n", tandem::kUsage);
    if (!help && argc >= 2) std::fprintf(stderr, "unknown subcommand '%s'\n", argv[1]);
    return help ? 0 : 2;
  }
  // Drop the subcommand: the rest are flags.
  std::vector<char*> args = {argv[0]};
  for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
  tandem::ParseToolFlags(static_cast<int>(args.size()), args.data(), tandem::kUsage);
  return tandem::Generate();
}
