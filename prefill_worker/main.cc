// tandem-prefill: the prefill worker. Computes prompts (batched, chunked),
// streams their KV cache to decode workers over UCX, and answers
// tandem.v1.PrefillWorker. Logic lives in PrefillLoop / PrefillService.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/base/dtype.h"
#include "common/base/executor.h"
#include "common/base/flags.h"
#include "common/base/logging.h"
#include "common/base/port_file.h"
#include "common/base/served_model.h"
#include "common/base/status_macros.h"
#include "common/compute/backend_choice.h"
#include "common/engine/engine.h"
#include "common/metrics/metrics_server.h"
#include "common/model/model_weights.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/server.h"
#include "common/rpc/tls_flags.h"
#include "common/worker/kv_tier_flags.h"
#include "common/worker/worker_engine.h"
#include "common/worker/worker_flags.h"
#include "common/worker/worker_grammar.h"
#include "kvtransfer/ucx/ucx_transport.h"
#include "prefill_worker/prefill_loop.h"
#include "prefill_worker/prefill_metrics.h"
#include "prefill_worker/prefill_service.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:8200",
          "host:port to serve tandem.v1.PrefillWorker on; port 0 picks a free port");
ABSL_FLAG(int, max_batch_tokens, 2048,
          "Most prompt tokens per engine step, over all prompts in it; longer prompts are "
          "computed in chunks over several steps");
ABSL_FLAG(int, max_queue, 256,
          "Most requests waiting for KV blocks; more are refused with RESOURCE_EXHAUSTED");
ABSL_FLAG(int, kv_lanes, 1,
          "Connections each KV transfer is striped over (helps long, high-latency links)");

namespace tandem {
namespace {

absl::Status Run() {
  const std::string model_path = absl::GetFlag(FLAGS_model);
  if (model_path.empty()) return absl::InvalidArgumentError("--model is required (see --help)");
  ASSIGN_OR_RETURN(const std::string served_model_name,
                   ServedModelName(absl::GetFlag(FLAGS_served_model_name),
                                   absl::GetFlag(FLAGS_model_name), model_path));
  ASSIGN_OR_RETURN(const std::optional<DType> kv_dtype,
                   ParseKvDTypeFlag(absl::GetFlag(FLAGS_kv_dtype)));
  ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> weights, LoadModel(model_path));
  const std::string fingerprint = LoggedFingerprint(*weights);
  const std::string backend_name = absl::GetFlag(FLAGS_backend);
  ASSIGN_OR_RETURN(BackendChoice backend, ChooseBackend({.name = backend_name,
                                                         .threads = absl::GetFlag(FLAGS_threads),
                                                         .device = absl::GetFlag(FLAGS_device)}));
  LOG(INFO) << "backend: " << backend.description;
  ASSIGN_OR_RETURN(const double gpu_memory_fraction,
                   GpuMemoryFractionFor(*backend.backend, absl::GetFlag(FLAGS_gpu_memory_fraction),
                                        absl::GetFlag(FLAGS_kv_blocks)));
  ASSIGN_OR_RETURN(std::unique_ptr<kvtransfer::UcxTransport> transport,
                   kvtransfer::UcxTransport::Create(kvtransfer::UcxTransportOptions{
                       .net_devices = absl::GetFlag(FLAGS_kv_net_devices)}));

  auto metrics_registry = std::make_shared<prometheus::Registry>();
  prefill::PrefillMetrics prefill_metrics(*metrics_registry);
  ASSIGN_OR_RETURN(std::unique_ptr<metrics::MetricsServer> metrics_server,
                   metrics::StartMetricsServerFromFlags(metrics_registry));

  prefill::PrefillLoopOptions options;
  options.metrics = &prefill_metrics;
  options.model_name = served_model_name;
  options.weights_fingerprint = fingerprint;
  options.kv_dtype = kv_dtype;
  options.block_size = absl::GetFlag(FLAGS_block_size);
  options.kv_blocks = absl::GetFlag(FLAGS_kv_blocks);
  options.gpu_memory_fraction = gpu_memory_fraction;
  options.kv_staging_blocks = absl::GetFlag(FLAGS_kv_staging_blocks);
  options.warm_up_tokens = absl::GetFlag(FLAGS_warm_up_tokens);
  options.transport_device_memory = transport->SupportsMemory(kvtransfer::MemoryKind::kCuda);
  LOG(INFO) << "KV transport memory types: " << transport->MemoryTypes();
  options.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  options.max_queue = absl::GetFlag(FLAGS_max_queue);
  options.kv_lanes = absl::GetFlag(FLAGS_kv_lanes);
  options.prefix_cache = absl::GetFlag(FLAGS_prefix_cache);
  options.transport_peers = [t = transport.get()] { return t->num_peers(); };
  // The tier's disk threads outlive the loop (it is reset first).
  ASSIGN_OR_RETURN(WorkerKvTier kv_tier, WorkerKvTierFromFlags());
  options.make_kv_tier = kv_tier.make;
  options.kv_tier_wait = kv_tier.wait;
  ASSIGN_OR_RETURN(std::unique_ptr<prefill::PrefillLoop> loop,
                   prefill::PrefillLoop::Create(*weights, std::move(backend.backend),
                                                transport.get(), &Clock::Real(), options));
  weights.reset();

  ASSIGN_OR_RETURN(std::unique_ptr<grammar::GrammarCache> grammars,
                   LoadWorkerGrammars(model_path, absl::GetFlag(FLAGS_tokenizer)));
  // Structured outputs' grammars compile on threads of their own, never on
  // a gRPC thread; they go after the server's shutdown, before the loop.
  auto compiles = std::make_unique<ThreadPoolExecutor>(2);
  const ConstraintResolver constraints(grammars.get(), compiles.get());
  prefill::PrefillService service(loop.get(), &constraints);
  rpc::ServerOptions server_options;
  server_options.address = absl::GetFlag(FLAGS_listen);
  server_options.tls = rpc::ServerTlsFromFlags();
  ASSIGN_OR_RETURN(rpc::RunningServer server, rpc::StartServer(server_options, {&service}));
  if (const std::string path = absl::GetFlag(FLAGS_port_file); !path.empty()) {
    RETURN_IF_ERROR(WritePortFile(path, server.port, "port_file"));
  }
  // NOT_SERVING once the engine fails; the loop goes before the server.
  prefill::ReportEngineHealth(*loop, server);
  const prefill::PrefillStats stats = loop->Stats();
  LOG(INFO) << "tandem-prefill serving " << options.model_name << " (weights " << fingerprint
            << ") on port " << server.port << " (" << stats.kv_blocks_total << " " << stats.kv_dtype
            << " KV blocks of " << stats.block_size << " tokens, " << (stats.kv_cache_bytes >> 20)
            << " MiB, max_batch_tokens " << options.max_batch_tokens << ", prefix cache "
            << (options.prefix_cache ? "on" : "off") << ", KV tier " << kv_tier.description << ", "
            << backend.description << ", KV over " << transport->name() << ")";

  const int signal = rpc::WaitForTerminationSignal();
  const absl::Duration drain_timeout = absl::GetFlag(FLAGS_drain_timeout);
  LOG(INFO) << "signal " << signal << ": draining (up to " << drain_timeout << ")";
  server.SetServing(false);
  loop->Drain();
  const absl::Time deadline = absl::Now() + drain_timeout;
  if (!loop->WaitUntilIdle(deadline)) {
    LOG(WARNING) << "drain timeout: cancelling what is still in flight";
  }
  // Calls still open after the deadline are cancelled; the loop answers them.
  server.server->Shutdown(rpc::ToChrono(std::max(deadline, absl::Now() + absl::Seconds(1))));
  compiles.reset();
  loop.reset();
  kv_tier.io.reset();
  transport.reset();
  LOG(INFO) << "tandem-prefill stopped";
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  tandem::rpc::BlockTerminationSignals();
  tandem::ParseToolFlags(
      argc, argv,
      "The tandem prefill worker: computes prompts and streams their KV cache to decode "
      "workers.\n"
      "Usage: tandem-prefill --model DIR|FILE [--served_model_name NAME] [--kv_dtype "
      "f32|bf16|f16|int8]\n"
      "       [--listen HOST:PORT] [--port_file FILE] [--backend cpu|cuda] [--device N]\n"
      "       [--threads N] [--kv_blocks N | --gpu_memory_fraction F] [--block_size N]\n"
      "       [--max_batch_tokens N] [--max_queue N]\n"
      "       [--drain_timeout 30s] [--noprefix_cache] [--kv_lanes N] [--kv_net_devices DEVICES]\n"
      "       [--kv_host_tier_gib G] [--kv_tier_dir DIR --kv_tier_gib G]\n"
      "       [--kv_tier_wait 250ms] [--kv_tier_io_threads N]\n"
      "       [--tls_cert FILE --tls_key FILE [--tls_client_ca FILE]]\n"
      "       [--metrics_listen HOST:PORT] [--metrics_port_file FILE]");
  if (absl::Status s = tandem::Run(); !s.ok()) {
    std::cerr << "tandem-prefill: " << s << "\n";
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
