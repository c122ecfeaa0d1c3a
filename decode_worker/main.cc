// tandem-decode: the decode worker. Serves tandem.v1.DecodeWorker: reserves
// KV blocks for a request, receives the prompt's KV cache from a prefill
// worker over UCX (or prefills locally), and streams the generated tokens.
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
#include "common/worker/worker_engine.h"
#include "common/worker/worker_flags.h"
#include "common/worker/worker_grammar.h"
#include "decode_worker/decode_loop.h"
#include "decode_worker/decode_metrics.h"
#include "decode_worker/decode_service.h"
#include "decode_worker/schedule_policy.h"
#include "kvtransfer/ucx/ucx_transport.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:8300",
          "host:port to serve gRPC on; port 0 picks a free one");
ABSL_FLAG(int, kv_watermark_blocks, -1,
          "KV blocks admission leaves free for running sequences to grow into (a request holds "
          "its prompt's blocks and takes one more as each fills; when none is left, the running "
          "request of lowest priority is preempted and recomputed later); -1 = 2% of the pool, "
          "at least 1");
ABSL_FLAG(int, max_batch_tokens, 2048,
          "Most tokens one engine step carries: one per running sequence, then chunks of local "
          "prefills");
ABSL_FLAG(std::string, schedule_policy, "decode_priority",
          "How an engine step is filled: decode_priority (every running sequence decodes, local "
          "prompt chunks fill the rest of --max_batch_tokens), chunked (the same within "
          "--prefill_chunk_tokens per step) or prefill_first (a waiting local prompt is computed "
          "whole in its own step before decodes go on)");
ABSL_FLAG(int, prefill_chunk_tokens, 512,
          "Tokens per step under --schedule_policy=chunked, decode tokens included; at least "
          "--max_sequences, at most --max_batch_tokens");
ABSL_FLAG(int, max_sequences, 64,
          "Most requests held at once (running, waiting for KV or Start, prefilling); more are "
          "refused with RESOURCE_EXHAUSTED");
ABSL_FLAG(absl::Duration, kv_timeout, absl::Seconds(30),
          "How long a reservation waits for its KV cache and its Start before it expires "
          "(DEADLINE_EXCEEDED) and its blocks are freed");
ABSL_FLAG(uint64_t, kv_chunk_bytes, 0,
          "Bytes per KV transfer message (the lease's chunk size); 0 = one message per layer");
ABSL_FLAG(bool, kv_handoff, true,
          "When draining, ship the K/V of streams the router moves to their new worker instead "
          "of having it recompute them (CPU KV only)");
ABSL_FLAG(bool, kv_checksums, true,
          "Ask prefill workers for an XXH3-64 checksum per KV chunk and verify it on receipt "
          "(a mismatch fails the transfer and the prompt is computed again); "
          "--nokv_checksums turns them off");
ABSL_FLAG(int, kv_verify_threads, 1,
          "Threads that verify KV checksums while the next chunks land (0 to 8); 0 = each chunk "
          "is checked on the worker's loop thread as it lands");
namespace tandem {
namespace {

absl::Status Run() {
  const std::string model_path = absl::GetFlag(FLAGS_model);
  if (model_path.empty()) return absl::InvalidArgumentError("--model is required (see --help)");
  if (const int n = absl::GetFlag(FLAGS_kv_verify_threads); n < 0 || n > 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv_verify_threads is ", n, "; give 0 (check inline) to 8"));
  }
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
  const std::string backend_info = backend.description;
  LOG(INFO) << "backend: " << backend_info;
  ASSIGN_OR_RETURN(const double gpu_memory_fraction,
                   GpuMemoryFractionFor(*backend.backend, absl::GetFlag(FLAGS_gpu_memory_fraction),
                                        absl::GetFlag(FLAGS_kv_blocks)));
  ASSIGN_OR_RETURN(std::unique_ptr<kvtransfer::UcxTransport> transport,
                   kvtransfer::UcxTransport::Create(kvtransfer::UcxTransportOptions{
                       .net_devices = absl::GetFlag(FLAGS_kv_net_devices)}));
  // A draining worker ships the K/V of the streams it hands off over its
  // own transport: the first one's events belong to the receiver.
  std::unique_ptr<kvtransfer::UcxTransport> handoff_transport;
  if (absl::GetFlag(FLAGS_kv_handoff)) {
    ASSIGN_OR_RETURN(handoff_transport,
                     kvtransfer::UcxTransport::Create(kvtransfer::UcxTransportOptions{
                         .net_devices = absl::GetFlag(FLAGS_kv_net_devices)}));
  }

  auto metrics_registry = std::make_shared<prometheus::Registry>();
  decode::DecodeMetrics decode_metrics(*metrics_registry);
  ASSIGN_OR_RETURN(std::unique_ptr<metrics::MetricsServer> metrics_server,
                   metrics::StartMetricsServerFromFlags(metrics_registry));

  decode::DecodeLoopOptions options;
  options.metrics = &decode_metrics;
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
  options.kv_watermark_blocks = absl::GetFlag(FLAGS_kv_watermark_blocks);
  options.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  options.max_sequences = absl::GetFlag(FLAGS_max_sequences);
  ASSIGN_OR_RETURN(options.schedule_policy,
                   decode::ParseSchedulePolicy(absl::GetFlag(FLAGS_schedule_policy)));
  options.prefill_chunk_tokens = absl::GetFlag(FLAGS_prefill_chunk_tokens);
  options.kv_timeout = absl::GetFlag(FLAGS_kv_timeout);
  options.receiver.chunk_bytes = absl::GetFlag(FLAGS_kv_chunk_bytes);
  options.receiver.checksums = absl::GetFlag(FLAGS_kv_checksums);
  options.receiver.verify_threads = absl::GetFlag(FLAGS_kv_verify_threads);
  options.prefix_cache = absl::GetFlag(FLAGS_prefix_cache);
  options.handoff_transport = handoff_transport.get();
  ASSIGN_OR_RETURN(
      std::unique_ptr<decode::DecodeLoop> loop,
      decode::DecodeLoop::Create(*weights, std::move(backend.backend), transport.get(), options));
  weights.reset();
  const ModelConfig& config = loop->config();

  ASSIGN_OR_RETURN(std::unique_ptr<grammar::GrammarCache> grammars,
                   LoadWorkerGrammars(model_path, absl::GetFlag(FLAGS_tokenizer)));
  // Structured outputs' grammars compile on threads of their own, never on
  // a gRPC thread; they go after the server's shutdown, before the loop.
  auto compiles = std::make_unique<ThreadPoolExecutor>(2);
  const ConstraintResolver constraints(grammars.get(), compiles.get());
  decode::DecodeService service(loop.get(), &constraints);
  ASSIGN_OR_RETURN(rpc::RunningServer server,
                   rpc::StartServer(rpc::ServerOptions{.address = absl::GetFlag(FLAGS_listen),
                                                       .tls = rpc::ServerTlsFromFlags()},
                                    {&service}));
  if (const std::string path = absl::GetFlag(FLAGS_port_file); !path.empty()) {
    RETURN_IF_ERROR(WritePortFile(path, server.port, "port_file"));
  }
  // NOT_SERVING once the engine fails; the loop stops before the server.
  decode::ReportEngineHealth(*loop, server);
  const decode::LoopStats stats = loop->Stats();
  LOG(INFO) << "tandem-decode serving " << options.model_name << " (weights " << fingerprint
            << ") on port " << server.port << " (" << config.n_layers << " layers, context "
            << config.seq_len << ", " << stats.kv_blocks_total << " " << stats.kv_dtype
            << " KV blocks of " << stats.block_size << " tokens, " << (stats.kv_cache_bytes >> 20)
            << " MiB, " << backend_info << ", KV transport " << transport->name() << ")";

  const int signal = rpc::WaitForTerminationSignal();
  const absl::Duration drain_timeout = absl::GetFlag(FLAGS_drain_timeout);
  LOG(INFO) << "tandem-decode: signal " << signal << ", draining (up to "
            << absl::FormatDuration(drain_timeout) << ")";
  server.SetServing(false);
  loop->Drain();
  if (!loop->WaitUntilIdle(drain_timeout)) {
    LOG(WARNING) << "tandem-decode: requests still running after the drain timeout; ending them";
  }
  // Ends what is left and answers every open call, so that the server's
  // shutdown has nothing to wait for; the service may still call the
  // stopped loop until then.
  loop->Stop();
  server.server->Shutdown(rpc::ToChrono(absl::Now() + absl::Seconds(5)));
  compiles.reset();
  loop.reset();
  handoff_transport.reset();
  transport.reset();
  LOG(INFO) << "tandem-decode: stopped";
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  // Before any thread exists, so that every thread inherits the mask.
  tandem::rpc::BlockTerminationSignals();
  tandem::ParseToolFlags(
      argc, argv,
      "The tandem decode worker: serves tandem.v1.DecodeWorker (Generate, Start, GetStats).\n"
      "Reserves KV blocks per request, receives the prompt's KV cache from a prefill worker\n"
      "over UCX (or prefills locally) and streams generated tokens to the router.\n"
      "Usage: tandem-decode --model DIR|FILE [--served_model_name NAME] [--kv_dtype "
      "f32|bf16|f16|int8]\n"
      "       [--listen HOST:PORT] [--port_file FILE] [--kv_net_devices DEVICES]\n"
      "       [--backend cpu|cuda] [--device N] [--kv_blocks N | --gpu_memory_fraction F]\n"
      "       [--tls_cert FILE --tls_key FILE [--tls_client_ca FILE]]\n"
      "       [--metrics_listen HOST:PORT --metrics_port_file FILE] ...");
  if (absl::Status s = tandem::Run(); !s.ok()) {
    std::cerr << "tandem-decode: " << s.message() << "\n";
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
