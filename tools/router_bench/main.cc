// tandem-router-bench: the router alone against instant fake workers, in
// one run: new streams per second per core, memory per open stream, and the
// latency the router adds to the time to first token.
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/flags.h"
#include "common/base/status_macros.h"
#include "common/rpc/server.h"
#include "tools/router_bench/instant_workers.h"
#include "tools/router_bench/load.h"
#include "tools/router_bench/report.h"
#include "tools/router_bench/router_process.h"
#include "tools/router_bench/stream_client.h"

ABSL_FLAG(std::string, router, "", "The tandem-router binary to measure (required)");
ABSL_FLAG(std::string, tokenizer, "../shared/models/tok512.bin",
          "The router's --tokenizer; prompts are token ids, so any small tokenizer does");
ABSL_FLAG(int, vocab_size, 512,
          "Vocabulary the fake workers report: at least the tokenizer's; prompt ids are below it");
ABSL_FLAG(int, router_cpu, -1,
          "Pin the router to this CPU (and keep the benchmark off it), so that its figures are "
          "per core; -1 = not pinned");
ABSL_FLAG(std::string, router_args, "--request_log=/dev/null",
          "More router flags, space-separated");
ABSL_FLAG(std::string, router_log, "",
          "The router's stdout and stderr; empty = /tmp/tandem-router-bench.<pid>.log");
ABSL_FLAG(bool, disaggregated, false,
          "Add an instant prefill worker (each request: Generate, Prefill, Start); default: "
          "decode workers prefill locally");
ABSL_FLAG(std::string, phases, "throughput,memory,ttft", "Which measurements, comma-separated");
ABSL_FLAG(int, prompt_tokens, 16, "Prompt length in token ids");
ABSL_FLAG(int, max_tokens, 4, "Short requests ask for 1..this many tokens, in turn");
ABSL_FLAG(int, channels, 4, "Client connections to the router (calls are multiplexed on them)");
ABSL_FLAG(absl::Duration, warmup, absl::Seconds(1), "Load before each measured window");
ABSL_FLAG(int, concurrency, 256, "throughput: streams kept in flight (closed loop)");
ABSL_FLAG(absl::Duration, duration, absl::Seconds(5), "throughput: measured window");
ABSL_FLAG(int, streams, 10000, "memory: streams held open at once");
ABSL_FLAG(int, hold_max_tokens, 8, "memory: max_tokens of a held stream (> 1)");
ABSL_FLAG(absl::Duration, open_timeout, absl::Seconds(60),
          "memory: how long the streams may take to open");
ABSL_FLAG(double, rate, 1000, "ttft: requests per second (open loop)");
ABSL_FLAG(std::string, arrivals, "poisson", "ttft: poisson or uniform gaps");
ABSL_FLAG(absl::Duration, ttft_duration, absl::Seconds(5),
          "ttft: sending window, for the direct run and the routed run each");
ABSL_FLAG(absl::Duration, call_timeout, absl::Seconds(120), "Deadline of every call");
ABSL_FLAG(bool, quick, false,
          "Tiny sizes for a smoke test (flags left at their defaults shrink to a few requests)");

namespace tandem::router_bench {
namespace {

constexpr char kUsage[] =
    "Measures a tandem-router against instant in-process fake workers: new streams/s per core, "
    "memory per open stream, added TTFT.\n"
    "Usage: tandem-router-bench --router PATH/tandem-router [--tokenizer FILE] "
    "[--router_cpu N] [--phases throughput,memory,ttft]\n"
    "       [--concurrency C --duration D] [--streams N] [--rate R --ttft_duration D] "
    "[--disaggregated] [--quick]";

// Sets `name` to `value` unless given on the command line (still at its
// default).
void ShrinkFlag(const char* name, const char* value) {
  absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  if (flag == nullptr || flag->CurrentValue() != flag->DefaultValue()) return;
  std::string error;
  flag->ParseFrom(value, &error);
}

void ApplyQuick() {
  ShrinkFlag("warmup", "200ms");
  ShrinkFlag("concurrency", "4");
  ShrinkFlag("duration", "500ms");
  ShrinkFlag("streams", "20");
  ShrinkFlag("open_timeout", "30s");
  ShrinkFlag("rate", "100");
  ShrinkFlag("ttft_duration", "500ms");
  ShrinkFlag("call_timeout", "30s");
}

struct Phases {
  bool throughput = false;
  bool memory = false;
  bool ttft = false;
};

absl::StatusOr<Phases> ParsePhases(const std::string& flag) {
  Phases phases;
  for (absl::string_view p : absl::StrSplit(flag, ',', absl::SkipWhitespace())) {
    if (p == "throughput") {
      phases.throughput = true;
    } else if (p == "memory") {
      phases.memory = true;
    } else if (p == "ttft") {
      phases.ttft = true;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--phases: unknown phase '", p, "'; use throughput, memory and/or ttft"));
    }
  }
  return phases;
}

absl::Status CheckFlags() {
  if (absl::GetFlag(FLAGS_router).empty()) {
    return absl::InvalidArgumentError("--router (the tandem-router binary) is required");
  }
  auto positive = [](int v, const char* name) {
    return v >= 1 ? absl::OkStatus()
                  : absl::InvalidArgumentError(absl::StrCat("--", name, " must be at least 1"));
  };
  RETURN_IF_ERROR(positive(absl::GetFlag(FLAGS_prompt_tokens), "prompt_tokens"));
  RETURN_IF_ERROR(positive(absl::GetFlag(FLAGS_max_tokens), "max_tokens"));
  RETURN_IF_ERROR(positive(absl::GetFlag(FLAGS_channels), "channels"));
  RETURN_IF_ERROR(positive(absl::GetFlag(FLAGS_concurrency), "concurrency"));
  RETURN_IF_ERROR(positive(absl::GetFlag(FLAGS_streams), "streams"));
  if (absl::GetFlag(FLAGS_streams) > 1000000 || absl::GetFlag(FLAGS_concurrency) > 1000000) {
    return absl::InvalidArgumentError("--streams and --concurrency must be at most 1000000");
  }
  if (absl::GetFlag(FLAGS_hold_max_tokens) < 2) {
    return absl::InvalidArgumentError(
        "--hold_max_tokens must be at least 2 (a held stream outlives its first token)");
  }
  if (absl::GetFlag(FLAGS_prompt_tokens) +
          std::max(absl::GetFlag(FLAGS_max_tokens), absl::GetFlag(FLAGS_hold_max_tokens)) >
      InstantModel().max_context) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--prompt_tokens plus --max_tokens (or --hold_max_tokens) must fit the fake model's "
        "context of ",
        InstantModel().max_context, " tokens"));
  }
  const double rate = absl::GetFlag(FLAGS_rate);
  if (!(rate > 0 && rate <= 1e6)) {
    return absl::InvalidArgumentError("--rate must be in (0, 1000000] requests/s");
  }
  const std::string arrivals = absl::GetFlag(FLAGS_arrivals);
  if (arrivals != "poisson" && arrivals != "uniform") {
    return absl::InvalidArgumentError("--arrivals must be poisson or uniform");
  }
  if (absl::GetFlag(FLAGS_vocab_size) < 4) {
    return absl::InvalidArgumentError("--vocab_size must be at least 4");
  }
  for (absl::Duration d : {absl::GetFlag(FLAGS_duration), absl::GetFlag(FLAGS_ttft_duration),
                           absl::GetFlag(FLAGS_call_timeout), absl::GetFlag(FLAGS_open_timeout)}) {
    if (d <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          "--duration, --ttft_duration, --call_timeout and --open_timeout must be positive");
    }
  }
  if (absl::GetFlag(FLAGS_warmup) < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--warmup must be >= 0");
  }
  return absl::OkStatus();
}

// A few calls' worth of load so that connections are up before a window.
void Warm(StreamTarget& target) {
  RunClosedLoop(
      target,
      {.concurrency = 4,
       .max_tokens = absl::GetFlag(FLAGS_max_tokens),
       .warmup = absl::ZeroDuration(),
       .duration = std::min(absl::GetFlag(FLAGS_warmup), absl::Milliseconds(500)),
       .drain_timeout = absl::GetFlag(FLAGS_call_timeout)},
      [] {}, [] {});
}

ThroughputFigures MeasureThroughput(StreamTarget& router_target, const RouterProcess& router) {
  std::optional<ProcessSample> before;
  std::optional<ProcessSample> after;
  const ClosedLoopResult r = RunClosedLoop(
      router_target,
      {.concurrency = absl::GetFlag(FLAGS_concurrency),
       .max_tokens = absl::GetFlag(FLAGS_max_tokens),
       .warmup = absl::GetFlag(FLAGS_warmup),
       .duration = absl::GetFlag(FLAGS_duration),
       .drain_timeout = absl::GetFlag(FLAGS_call_timeout)},
      [&] {
        if (auto s = router.Sample(); s.ok()) before = *s;
      },
      [&] {
        if (auto s = router.Sample(); s.ok()) after = *s;
      });
  ThroughputFigures f;
  f.concurrency = absl::GetFlag(FLAGS_concurrency);
  f.window_s = absl::ToDoubleSeconds(r.window);
  f.completed = r.completed;
  f.errors = r.errors;
  f.error_summary = r.error_summary;
  f.drained = r.drained;
  if (before.has_value() && after.has_value()) f.cpu_s = after->cpu_seconds - before->cpu_seconds;
  return f;
}

MemoryFigures MeasureMemory(StreamTarget& router_target, const RouterProcess& router,
                            InstantDecodeWorker& decode) {
  MemoryFigures f;
  f.requested = absl::GetFlag(FLAGS_streams);
  if (auto s = router.Sample(); s.ok()) f.before = *s;
  decode.SetHold(true);
  HeldStreams held(router_target, f.requested, absl::GetFlag(FLAGS_hold_max_tokens));
  f.all_opened = held.WaitOpen(absl::GetFlag(FLAGS_open_timeout));
  if (auto s = router.Sample(); s.ok()) f.open_sample = *s;
  f.open = held.open();
  f.held_by_worker = decode.held();
  decode.SetHold(false);
  // A stream may reach the worker's hold just after a release: release
  // until every call has ended.
  const absl::Time deadline = absl::Now() + absl::GetFlag(FLAGS_call_timeout);
  decode.ReleaseHeld();
  while (!held.WaitDone(absl::Milliseconds(500)) && absl::Now() < deadline) decode.ReleaseHeld();
  f.drained = held.WaitDone(absl::ZeroDuration());
  f.errors = held.recorder().errors();
  f.error_summary = held.recorder().DescribeErrors();
  if (auto s = router.Sample(); s.ok()) f.after = *s;
  return f;
}

TtftFigures MeasureTtft(StreamTarget& router_target, StreamTarget& decode_target) {
  const OpenLoopOptions options = {.rate = absl::GetFlag(FLAGS_rate),
                                   .poisson = absl::GetFlag(FLAGS_arrivals) == "poisson",
                                   .max_tokens = absl::GetFlag(FLAGS_max_tokens),
                                   .duration = absl::GetFlag(FLAGS_ttft_duration),
                                   .drain_timeout = absl::GetFlag(FLAGS_call_timeout)};
  Warm(decode_target);
  const OpenLoopResult direct = RunOpenLoop(decode_target, options);
  Warm(router_target);
  const OpenLoopResult routed = RunOpenLoop(router_target, options);
  TtftFigures f;
  f.rate = options.rate;
  auto fill = [](const OpenLoopResult& r, TtftFigures::Side* side) {
    side->sent = r.sent;
    side->errors = r.errors;
    side->achieved_rate = r.achieved_rate;
    side->samples = static_cast<int64_t>(r.ttfts.size());
    side->p50 = Percentile(r.ttfts, 50);
    side->p99 = Percentile(r.ttfts, 99);
    side->error_summary = r.error_summary;
    side->drained = r.drained;
  };
  fill(direct, &f.direct);
  fill(routed, &f.routed);
  return f;
}

absl::Status Run() {
  if (absl::GetFlag(FLAGS_quick)) ApplyQuick();
  RETURN_IF_ERROR(CheckFlags());
  ASSIGN_OR_RETURN(const Phases phases, ParsePhases(absl::GetFlag(FLAGS_phases)));
  const int router_cpu = absl::GetFlag(FLAGS_router_cpu);
  if (router_cpu >= 0) RETURN_IF_ERROR(AvoidCpu(router_cpu));
  const int64_t file_limit = RaiseFileLimit();

  InstantModel model;
  model.vocab_size = absl::GetFlag(FLAGS_vocab_size);
  InstantDecodeWorker decode(model);
  InstantPrefillWorker prefill(model);
  ASSIGN_OR_RETURN(rpc::RunningServer decode_server, rpc::StartServer({}, {&decode}));
  std::optional<rpc::RunningServer> prefill_server;
  if (absl::GetFlag(FLAGS_disaggregated)) {
    ASSIGN_OR_RETURN(prefill_server, rpc::StartServer({}, {&prefill}));
  }

  RouterLaunch launch;
  launch.binary = absl::GetFlag(FLAGS_router);
  launch.cpu = router_cpu;
  launch.log_path = absl::GetFlag(FLAGS_router_log);
  if (launch.log_path.empty()) {
    launch.log_path = absl::StrCat("/tmp/tandem-router-bench.", getpid(), ".log");
  }
  const int max_inflight =
      std::max(20000, absl::GetFlag(FLAGS_streams) + absl::GetFlag(FLAGS_concurrency) + 1000);
  launch.args = {
      absl::StrCat("--decode_workers=127.0.0.1:", decode_server.port),
      absl::StrCat("--tokenizer=", absl::GetFlag(FLAGS_tokenizer)),
      "--listen=127.0.0.1:0",
      absl::StrCat("--max_inflight=", max_inflight),
  };
  if (prefill_server.has_value()) {
    launch.args.push_back(absl::StrCat("--prefill_workers=127.0.0.1:", prefill_server->port));
  }
  for (absl::string_view a :
       absl::StrSplit(absl::GetFlag(FLAGS_router_args), ' ', absl::SkipWhitespace())) {
    launch.args.emplace_back(a);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<RouterProcess> router, RouterProcess::Start(launch));

  RunInfo info;
  info.router = launch.binary;
  info.router_pid = router->pid();
  info.router_cpu = router_cpu;
  info.disaggregated = prefill_server.has_value();
  info.prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  info.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  info.file_limit = file_limit;
  info.router_log = launch.log_path;
  std::cout << Describe(info) << std::flush;

  TargetOptions target_options;
  target_options.channels = absl::GetFlag(FLAGS_channels);
  target_options.prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  target_options.vocab_size = absl::GetFlag(FLAGS_vocab_size);
  target_options.timeout = absl::GetFlag(FLAGS_call_timeout);
  target_options.address = absl::StrCat("127.0.0.1:", router->port());
  std::unique_ptr<StreamTarget> router_target = RouterTarget(target_options);
  target_options.address = absl::StrCat("127.0.0.1:", decode_server.port);
  std::unique_ptr<StreamTarget> decode_target = DecodeWorkerTarget(target_options);
  Warm(*router_target);

  Figures figures;
  if (phases.throughput) {
    std::cout << "measuring new streams/s ..." << std::endl;
    figures.throughput = MeasureThroughput(*router_target, *router);
  }
  if (phases.ttft) {
    std::cout << "measuring TTFT, direct then through the router ..." << std::endl;
    figures.ttft = MeasureTtft(*router_target, *decode_target);
  }
  if (phases.memory) {
    std::cout << "measuring memory per open stream ..." << std::endl;
    figures.memory = MeasureMemory(*router_target, *router, decode);
  }
  const absl::Status stopped = router->Stop(absl::Seconds(30));
  std::cout << Table(figures) << JsonLine(info, figures) << "\n" << std::flush;
  if (!stopped.ok()) std::cerr << "tandem-router-bench: " << stopped.message() << "\n";
  decode_server.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (prefill_server.has_value()) {
    prefill_server->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem::router_bench

int main(int argc, char** argv) {
  tandem::ParseToolFlags(argc, argv, tandem::router_bench::kUsage);
  if (absl::Status s = tandem::router_bench::Run(); !s.ok()) {
    std::cerr << "tandem-router-bench: " << s.message() << "\n";
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
