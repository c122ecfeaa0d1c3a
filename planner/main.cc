// tandem-planner: keeps the pools sized for the load. Every --interval it
// reads every router replica's /metrics, turns the growth since the last
// reading into an observation (request rate, TTFT and TPOT p99, ready
// workers), and asks the planner core (planner_core.h) for the pools'
// sizes, from tandem-plan's rate curve (--plan). Advisory mode logs each
// decision and serves it as metrics (tandem_planner_target_workers{pool} is
// what an HPA or KEDA follows); apply mode also changes the pools: through
// --apply_command (e.g. deploy/local/cluster.sh scale) or by scaling the
// pools' Deployments through the Kubernetes API (--kube_deployments).
#include <netdb.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <atomic>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/base/flags.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/metrics/metrics.h"
#include "common/metrics/metrics_server.h"
#include "httplib.h"
#include "planner/kube_scale.h"
#include "planner/planner_core.h"
#include "planner/router_scrape.h"
#include "prometheus/registry.h"

extern char** environ;

ABSL_FLAG(std::string, router_metrics, "127.0.0.1:9090",
          "HOST:PORT[,HOST:PORT...] of the routers' Prometheus endpoints (--metrics_listen); "
          "every address a HOST resolves to is read each interval and the routers are added "
          "up (a headless Service names every replica)");
ABSL_FLAG(std::string, plan, "",
          "tandem-plan's --plan_json, planned with --request_rates: the pools' sizes by rate");
ABSL_FLAG(absl::Duration, ttft_p99, absl::ZeroDuration(),
          "TTFT target: the observed p99 over it corrects the prefill pool; 0: no correction");
ABSL_FLAG(absl::Duration, tpot_p99, absl::ZeroDuration(),
          "TPOT target: the observed p99 over it corrects the decode pool; 0: no correction");
ABSL_FLAG(absl::Duration, interval, absl::Seconds(10), "How often the router is read");
ABSL_FLAG(absl::Duration, horizon, absl::Minutes(1),
          "How far ahead the load is forecast (about a worker's start-up)");
ABSL_FLAG(std::string, forecast, "trend", "The load forecast: constant or trend");
ABSL_FLAG(absl::Duration, trend_window, absl::Minutes(5), "The trend's window");
ABSL_FLAG(int, min_prefill, 0, "Fewest prefill workers");
ABSL_FLAG(int, max_prefill, 16, "Most prefill workers");
ABSL_FLAG(int, min_decode, 1, "Fewest decode workers");
ABSL_FLAG(int, max_decode, 64, "Most decode workers");
ABSL_FLAG(absl::Duration, cooldown, absl::Seconds(30), "No pool changes twice within this");
ABSL_FLAG(absl::Duration, scale_down_delay, absl::Minutes(2),
          "A pool shrinks only after the load asked for fewer for this long");
ABSL_FLAG(double, burst_limit, 0.1,
          "Prompts prefilled on decode workers because every prefill worker was full (the "
          "router's --prefill_burst_queue): over this share of requests for --burst_intervals "
          "readings in a row, the prefill pool counts as short");
ABSL_FLAG(int, burst_intervals, 3, "See --burst_limit");
ABSL_FLAG(absl::Duration, start_timeout, absl::Minutes(5),
          "A pool short of ready workers this long after a change is reported");
ABSL_FLAG(std::string, mode, "advisory",
          "advisory: decide, log and serve the decisions as metrics; apply: also run "
          "--apply_command or scale --kube_deployments");
ABSL_FLAG(std::string, kube_deployments, "",
          "Apply mode in Kubernetes: prefill=NAME,decode=NAME, the pools' Deployments, scaled "
          "through the API with the pod's ServiceAccount (a pool left out is not changed)");
ABSL_FLAG(std::string, kube_api, "",
          "The Kubernetes API's URL; empty: the pod's own (KUBERNETES_SERVICE_HOST). "
          "http://127.0.0.1:8001 reaches `kubectl proxy` from outside the cluster");
ABSL_FLAG(std::string, kube_namespace, "", "The Deployments' namespace; empty: the pod's own");
ABSL_FLAG(std::string, apply_command, "",
          "Apply mode: a shell command run with {prefill} and {decode} replaced by the new sizes "
          "(e.g. \"deploy/local/cluster.sh scale --prefill {prefill} --decode {decode}\")");
ABSL_FLAG(absl::Duration, apply_timeout, absl::Minutes(5),
          "The apply command is killed after this long");
ABSL_FLAG(std::string, decisions_log, "", "Append each decision here as a JSON line");
ABSL_FLAG(absl::Duration, run_for, absl::ZeroDuration(), "Stop after this long; 0: until SIGTERM");

namespace tandem::planner {
namespace {

constexpr char kUsage[] =
    "Sizes tandem's prefill and decode pools for the load.\n"
    "Usage: tandem-planner --router_metrics HOST:PORT --plan plan.json [--ttft_p99 500ms "
    "--tpot_p99 50ms] [--mode advisory|apply --apply_command CMD | --kube_deployments "
    "prefill=NAME,decode=NAME]";

std::atomic<bool> stop{false};

struct Endpoint {
  std::string host;  // an address
  int port = 0;
  std::string key() const {
    return absl::StrCat(host.find(':') != std::string::npos ? "[" + host + "]" : host, ":", port);
  }
};

// Every address each HOST:PORT of `targets` resolves to now (router pods
// come and go behind a headless Service's name).
absl::StatusOr<std::vector<Endpoint>> Resolve(const std::string& targets) {
  std::vector<Endpoint> out;
  for (absl::string_view target : absl::StrSplit(targets, ',', absl::SkipEmpty())) {
    const size_t colon = target.rfind(':');
    int port = 0;
    if (colon == absl::string_view::npos || !absl::SimpleAtoi(target.substr(colon + 1), &port) ||
        port <= 0 || port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("--router_metrics has '", target, "'; give HOST:PORT"));
    }
    std::string host(absl::StripPrefix(absl::StripSuffix(target.substr(0, colon), "]"), "["));
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (const int e = getaddrinfo(host.c_str(), nullptr, &hints, &found); e != 0) {
      LOG(WARNING) << "cannot resolve " << host << ": " << gai_strerror(e);
      continue;
    }
    // One family per name: a dual-stack name gives each router under both,
    // and reading it twice would count it twice. IPv4 where there is any.
    const bool any_v4 = [&] {
      for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
        if (a->ai_family == AF_INET) return true;
      }
      return false;
    }();
    for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
      if (any_v4 && a->ai_family != AF_INET) continue;
      char name[NI_MAXHOST];
      if (getnameinfo(a->ai_addr, a->ai_addrlen, name, sizeof(name), nullptr, 0, NI_NUMERICHOST) ==
          0) {
        Endpoint e{name, port};
        const bool seen = std::any_of(out.begin(), out.end(),
                                      [&](const Endpoint& o) { return o.key() == e.key(); });
        if (!seen) out.push_back(std::move(e));
      }
    }
    freeaddrinfo(found);
  }
  return out;
}

absl::StatusOr<RouterScrape> Scrape(const Endpoint& e) {
  httplib::Client client(e.host, e.port);
  client.set_connection_timeout(2);
  client.set_read_timeout(5);
  const absl::Time at = absl::Now();
  const httplib::Result r = client.Get("/metrics");
  if (!r) {
    return absl::UnavailableError(
        absl::StrCat("cannot read http://", e.key(), "/metrics: ", httplib::to_string(r.error())));
  }
  if (r->status != 200) {
    return absl::UnavailableError(
        absl::StrCat("http://", e.key(), "/metrics answered ", r->status));
  }
  return ParseRouterMetrics(r->body, at);
}

// One reading of every router; the first error when none could be read.
// One reading of every router; the first error when none could be read. A
// router still listed whose read failed keeps its reading from `last`, so
// that its next good read covers both intervals (a dropped reading would
// count it as new, and its requests would vanish from two intervals).
absl::StatusOr<RouterScrapes> ScrapeAll(const std::string& targets, const RouterScrapes& last) {
  ASSIGN_OR_RETURN(const std::vector<Endpoint> endpoints, Resolve(targets));
  RouterScrapes out;
  absl::Status first = absl::UnavailableError(
      absl::StrCat("--router_metrics '", targets, "' resolves to no address"));
  bool fresh = false;
  for (const Endpoint& e : endpoints) {
    absl::StatusOr<RouterScrape> r = Scrape(e);
    if (r.ok()) {
      out.emplace(e.key(), *std::move(r));
      fresh = true;
      continue;
    }
    LOG(WARNING) << r.status();
    if (!fresh) first = r.status();
    if (const auto was = last.find(e.key()); was != last.end()) out.emplace(*was);
  }
  if (!fresh) return first;
  return out;
}

// Runs `command` with /bin/sh, killing it after `timeout`.
absl::Status RunCommand(const std::string& command, absl::Duration timeout) {
  pid_t pid = 0;
  const char* argv[] = {"/bin/sh", "-c", command.c_str(), nullptr};
  if (const int e =
          posix_spawn(&pid, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ);
      e != 0) {
    return absl::InternalError(absl::StrCat("cannot start /bin/sh: ", strerror(e)));
  }
  const absl::Time deadline = absl::Now() + timeout;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (absl::Now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return absl::DeadlineExceededError(
          absl::StrCat("'", command, "' took longer than ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat("'", command, "' failed (status ", status, ")"));
  }
  return absl::OkStatus();
}

struct PlannerMetrics {
  explicit PlannerMetrics(prometheus::Registry& r)
      : target(prometheus::BuildGauge()
                   .Name("tandem_planner_target_workers")
                   .Help("The workers each pool should have now (what an autoscaler follows)")
                   .Register(r)),
        desired(prometheus::BuildGauge()
                    .Name("tandem_planner_desired_workers")
                    .Help("The workers the load asks for, before hysteresis and cool-down")
                    .Register(r)),
        target_prefill(target.Add({{"pool", "prefill"}})),
        target_decode(target.Add({{"pool", "decode"}})),
        desired_prefill(desired.Add({{"pool", "prefill"}})),
        desired_decode(desired.Add({{"pool", "decode"}})),
        forecast(metrics::AddGauge(r, "tandem_planner_forecast_requests_per_second",
                                   "The request rate forecast --horizon ahead")),
        changes(metrics::AddCounter(r, "tandem_planner_changes_total",
                                    "Decisions that changed a pool's size")),
        warnings(metrics::AddCounter(r, "tandem_planner_warnings_total",
                                     "Stale or missing metrics, and workers that did not start")),
        apply_failures(metrics::AddCounter(r, "tandem_planner_apply_failures_total",
                                           "Pool changes that failed or timed out")) {}
  prometheus::Family<prometheus::Gauge>& target;
  prometheus::Family<prometheus::Gauge>& desired;
  prometheus::Gauge& target_prefill;
  prometheus::Gauge& target_decode;
  prometheus::Gauge& desired_prefill;
  prometheus::Gauge& desired_decode;
  prometheus::Gauge& forecast;
  prometheus::Counter& changes;
  prometheus::Counter& warnings;
  prometheus::Counter& apply_failures;
};

absl::StatusOr<PlannerOptions> OptionsFromFlags() {
  PlannerOptions o;
  o.prefill = {absl::GetFlag(FLAGS_min_prefill), absl::GetFlag(FLAGS_max_prefill)};
  o.decode = {absl::GetFlag(FLAGS_min_decode), absl::GetFlag(FLAGS_max_decode)};
  o.horizon = absl::GetFlag(FLAGS_horizon);
  o.cooldown = absl::GetFlag(FLAGS_cooldown);
  o.scale_down_delay = absl::GetFlag(FLAGS_scale_down_delay);
  o.start_timeout = absl::GetFlag(FLAGS_start_timeout);
  o.burst_limit = absl::GetFlag(FLAGS_burst_limit);
  o.burst_intervals = absl::GetFlag(FLAGS_burst_intervals);
  // Two intervals without a fresh reading is stale.
  o.stale_after = 2 * absl::GetFlag(FLAGS_interval);
  if (const absl::Duration t = absl::GetFlag(FLAGS_ttft_p99); t > absl::ZeroDuration()) {
    o.ttft_target = absl::ToDoubleSeconds(t);
  }
  if (const absl::Duration t = absl::GetFlag(FLAGS_tpot_p99); t > absl::ZeroDuration()) {
    o.tpot_target = absl::ToDoubleSeconds(t);
  }
  if (absl::GetFlag(FLAGS_interval) <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--interval must be positive, e.g. 10s");
  }
  return o;
}

// How apply mode changes the pools; null in advisory mode.
using Applier = std::function<absl::Status(const PoolCounts&)>;

// The pools' Deployments by pool (--kube_deployments).
absl::StatusOr<std::map<std::string, std::string>> KubeDeployments(const std::string& flag) {
  std::map<std::string, std::string> out;
  for (absl::string_view item : absl::StrSplit(flag, ',', absl::SkipEmpty())) {
    const std::pair<std::string, std::string> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    if ((kv.first != "prefill" && kv.first != "decode") || kv.second.empty() ||
        out.count(kv.first) > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--kube_deployments has '", item, "'; give prefill=NAME,decode=NAME, each once"));
    }
    out[kv.first] = kv.second;
  }
  return out;
}

// The Kubernetes applier, and the named Deployments' replicas now by pool
// (read once at start, so that a missing right fails here rather than at
// the first change).
absl::StatusOr<std::pair<Applier, std::map<std::string, int>>> KubeApplier(
    const PlannerOptions& options) {
  ASSIGN_OR_RETURN(const auto deployments, KubeDeployments(absl::GetFlag(FLAGS_kube_deployments)));
  KubeApi api;
  if (const std::string url = absl::GetFlag(FLAGS_kube_api); url.empty()) {
    ASSIGN_OR_RETURN(api, InClusterApi());
  } else {
    api.server = url;
  }
  if (const std::string ns = absl::GetFlag(FLAGS_kube_namespace); !ns.empty()) {
    api.kube_namespace = ns;
  }
  if (api.kube_namespace.empty()) {
    return absl::InvalidArgumentError("--kube_api outside a pod needs --kube_namespace");
  }
  RETURN_IF_ERROR(ParseServerUrl(api.server).status());
  auto scaler = std::make_shared<DeploymentScaler>(api);
  std::map<std::string, int> now;
  for (const auto& [pool, name] : deployments) {
    ASSIGN_OR_RETURN(now[pool], scaler->Replicas(name));
  }
  if (deployments.count("prefill") == 0 && options.prefill.max > 0) {
    return absl::InvalidArgumentError(
        "--kube_deployments names no prefill Deployment: give prefill=NAME or --max_prefill 0");
  }
  Applier apply = [scaler, deployments](const PoolCounts& target) -> absl::Status {
    for (const auto& [pool, name] : deployments) {
      RETURN_IF_ERROR(scaler->Scale(name, pool == "prefill" ? target.prefill : target.decode));
    }
    return absl::OkStatus();
  };
  return std::make_pair(std::move(apply), now);
}

absl::Status Main() {
  const std::string mode = absl::GetFlag(FLAGS_mode);
  const std::string command = absl::GetFlag(FLAGS_apply_command);
  const bool kube = !absl::GetFlag(FLAGS_kube_deployments).empty();
  if (mode != "advisory" && mode != "apply") {
    return absl::InvalidArgumentError(
        absl::StrCat("--mode is '", mode, "'; give advisory or apply"));
  }
  if (mode == "apply" && command.empty() == !kube) {
    return absl::InvalidArgumentError(
        "--mode apply needs one of --apply_command and --kube_deployments");
  }
  if (mode == "advisory" && (!command.empty() || kube)) {
    return absl::InvalidArgumentError(
        "--apply_command and --kube_deployments act only with --mode apply");
  }
  const std::string plan_path = absl::GetFlag(FLAGS_plan);
  std::ifstream plan_in(plan_path);
  if (plan_path.empty() || !plan_in) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--plan '", plan_path, "' cannot be read: give tandem-plan's --plan_json output"));
  }
  const nlohmann::json plan_json = nlohmann::json::parse(plan_in, nullptr, false);
  ASSIGN_OR_RETURN(ScalingTable table, ScalingTable::FromPlanJson(plan_json));
  ASSIGN_OR_RETURN(PlannerOptions options, OptionsFromFlags());
  ASSIGN_OR_RETURN(
      std::unique_ptr<Forecaster> forecaster,
      MakeForecaster(absl::GetFlag(FLAGS_forecast), absl::GetFlag(FLAGS_trend_window)));
  auto registry = std::make_shared<prometheus::Registry>();
  PlannerMetrics m(*registry);
  ASSIGN_OR_RETURN(std::unique_ptr<metrics::MetricsServer> server,
                   metrics::StartMetricsServerFromFlags(registry));
  std::ofstream log;
  if (const std::string path = absl::GetFlag(FLAGS_decisions_log); !path.empty()) {
    log.open(path, std::ios::app);
    if (!log) return absl::InvalidArgumentError(absl::StrCat("cannot open ", path));
  }

  Applier apply;
  std::map<std::string, int> deployed;  // the named Deployments' replicas
  if (mode == "apply" && kube) {
    ASSIGN_OR_RETURN(std::tie(apply, deployed), KubeApplier(options));
  } else if (mode == "apply") {
    apply = [command](const PoolCounts& target) {
      return RunCommand(absl::StrReplaceAll(command, {{"{prefill}", absl::StrCat(target.prefill)},
                                                      {"{decode}", absl::StrCat(target.decode)}}),
                        absl::GetFlag(FLAGS_apply_timeout));
    };
  }
  const absl::Duration run_for = absl::GetFlag(FLAGS_run_for);
  const absl::Time end =
      run_for > absl::ZeroDuration() ? absl::Now() + run_for : absl::InfiniteFuture();
  const std::string targets = absl::GetFlag(FLAGS_router_metrics);
  // The routers may start after the planner (one Helm release): wait for
  // the first reading, every --interval, until stopped or --run_for ends.
  absl::StatusOr<RouterScrapes> read = ScrapeAll(targets, {});
  while (!read.ok() && !absl::IsInvalidArgument(read.status()) && !stop.load() &&
         absl::Now() < end) {
    LOG(WARNING) << read.status() << "; trying again in "
                 << absl::FormatDuration(absl::GetFlag(FLAGS_interval));
    const absl::Time next = absl::Now() + absl::GetFlag(FLAGS_interval);
    while (absl::Now() < next && !stop.load()) absl::SleepFor(absl::Milliseconds(100));
    read = ScrapeAll(targets, {});
  }
  if (stop.load()) return absl::OkStatus();
  if (!read.ok()) return read.status();
  RouterScrapes last = *std::move(read);
  const Observation first = BetweenRouters({}, last);
  // Where the pools start: the Deployments' sizes where named, else what
  // the routers hold ready.
  PoolCounts initial{deployed.count("prefill") ? deployed["prefill"] : first.prefill_ready,
                     deployed.count("decode") ? deployed["decode"] : first.decode_ready};
  initial = {std::clamp(initial.prefill, options.prefill.min, options.prefill.max),
             std::clamp(initial.decode, options.decode.min, options.decode.max)};
  // What the pools were last set to (at first, what they are); a target
  // that differs, because it changed or its change failed, is applied
  // every interval until it takes.
  PoolCounts applied{deployed.count("prefill") ? deployed["prefill"] : first.prefill_ready,
                     deployed.count("decode") ? deployed["decode"] : first.decode_ready};
  ASSIGN_OR_RETURN(
      std::unique_ptr<PlannerCore> core,
      PlannerCore::Create(options, std::move(table), std::move(forecaster), initial, absl::Now()));
  LOG(INFO) << "tandem-planner (" << mode << "): the pools start at " << initial.prefill
            << " prefill and " << initial.decode << " decode workers";
  while (!stop.load()) {
    const absl::Time next = absl::Now() + absl::GetFlag(FLAGS_interval);
    while (absl::Now() < next && !stop.load()) absl::SleepFor(absl::Milliseconds(100));
    if (stop.load() || absl::Now() > end) break;
    Observation obs;
    obs.at = BetweenRouters({}, last).at;  // stale unless a fresh reading replaces it
    if (absl::StatusOr<RouterScrapes> now = ScrapeAll(targets, last); now.ok()) {
      obs = BetweenRouters(last, *now);
      last = *std::move(now);
    } else {
      LOG(WARNING) << now.status();
    }
    const Decision d = core->Step(obs, absl::Now());
    m.target_prefill.Set(d.target.prefill);
    m.target_decode.Set(d.target.decode);
    m.desired_prefill.Set(d.desired.prefill);
    m.desired_decode.Set(d.desired.decode);
    m.forecast.Set(d.forecast_rate);
    m.warnings.Increment(d.warnings.size());
    for (const std::string& w : d.warnings) LOG(WARNING) << w;
    nlohmann::json line = {{"unix_s", absl::ToUnixSeconds(absl::Now())},
                           {"rate", obs.request_rate.value_or(-1)},
                           {"ttft_p99", obs.ttft_p99.value_or(-1)},
                           {"tpot_p99", obs.tpot_p99.value_or(-1)},
                           {"burst_share", obs.burst_fraction.value_or(0)},
                           {"ready", {obs.prefill_ready, obs.decode_ready}},
                           {"forecast", d.forecast_rate},
                           {"desired", {d.desired.prefill, d.desired.decode}},
                           {"target", {d.target.prefill, d.target.decode}},
                           {"changed", d.changed},
                           {"reason", d.reason},
                           {"warnings", d.warnings}};
    if (d.changed) {
      m.changes.Increment();
      LOG(INFO) << "pools -> " << d.target.prefill << " prefill, " << d.target.decode
                << " decode: " << d.reason;
    }
    if (apply && !(d.target == applied)) {
      const absl::Status status = apply(d.target);
      line["applied"] = status.ok() ? "ok" : status.ToString();
      if (status.ok()) {
        applied = d.target;
      } else {
        m.apply_failures.Increment();
        LOG(ERROR) << status << " (tried again next interval)";
      }
    }
    if (log.is_open()) log << line.dump() << "\n" << std::flush;
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem::planner

int main(int argc, char** argv) {
  tandem::ParseToolFlags(argc, argv, tandem::planner::kUsage);
  signal(SIGTERM, [](int) { tandem::planner::stop.store(true); });
  signal(SIGINT, [](int) { tandem::planner::stop.store(true); });
  const absl::Status status = tandem::planner::Main();
  if (!status.ok()) {
    std::cerr << "tandem-planner: " << status << "\n";
    return 1;
  }
  return 0;
}
