#include "tools/sim/plan_search.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "tools/sim/cluster_args.h"

namespace tandem::sim {
namespace {

// Percentiles of the successful requests' latencies, in seconds.
double LatencyAt(const bench::RunResult& run, double q, double (*get)(const bench::RequestRecord&),
                 bool tpot) {
  std::vector<double> v;
  for (const bench::RequestRecord& r : run.records) {
    if (!r.success) continue;
    if (tpot) {
      if (const std::optional<double> t = bench::Tpot(r); t.has_value()) v.push_back(*t);
    } else {
      v.push_back(get(r));
    }
  }
  return bench::Percentile(std::move(v), q);
}

// Whether `a` ranks above `b` among points of the search: meeting the SLOs
// first, then fewer workers, more goodput, a lower SLO ratio; the order of
// evaluation breaks ties (stable sorts keep it).
bool Better(const PlanPoint& a, const PlanPoint& b) {
  if (a.meets != b.meets) return a.meets;
  if (!a.meets) return a.slo_ratio < b.slo_ratio;
  if (a.config.workers() != b.config.workers()) return a.config.workers() < b.config.workers();
  // Goodput within 1% is a tie: the same requests met over a run a few
  // milliseconds longer is not a better deployment.
  const double ga = a.metrics.goodput.value_or(0), gb = b.metrics.goodput.value_or(0);
  if (std::abs(ga - gb) > 0.01 * std::max(ga, gb)) return ga > gb;
  return a.slo_ratio < b.slo_ratio;
}

std::string Key(const PlanConfig& c) {
  return absl::StrCat(c.prefill, "/", c.decode, "/", c.DecodeArgs(), "/", c.PrefillArgs(), "/",
                      c.RouterArgs(), "/", c.kv_dtype);
}

class Search {
 public:
  Search(const PlanSpace& space, const PlanTargets& targets, const PlanEvaluator& evaluate,
         int jobs)
      : space_(space), targets_(targets), evaluate_(evaluate), jobs_(std::max(1, jobs)) {}

  absl::StatusOr<PlanResult> Run() {
    PlanConfig start;
    start.schedule_policy = space_.schedule_policies.front();
    start.prefill_chunk_tokens = space_.prefill_chunk_tokens.front();
    start.max_batch_tokens = space_.max_batch_tokens.front();
    start.local_prefill_tokens = space_.local_prefill_tokens.front();
    start.routing_policy = space_.routing_policies.front();
    start.kv_dtype = space_.kv_dtypes.front();
    // 1. Pool sizes, from the fewest workers up.
    std::optional<int> best;
    std::vector<int> ids;
    for (int n = 1; n <= space_.max_workers && !best.has_value(); ++n) {
      ASSIGN_OR_RETURN(ids, EvaluateAll(Splits(start, n)));
      best = BestMeeting(ids);
    }
    if (!best.has_value() && !ids.empty()) {
      // No split of the budget meets them with the first settings: perhaps
      // with others.
      int closest = ids.front();
      for (int id : ids) {
        if (Better(points_[id], points_[closest])) closest = id;
      }
      ASSIGN_OR_RETURN(const int tuned, Descend(closest));
      if (points_[tuned].meets) best = tuned;
    }
    if (best.has_value()) {
      // 2 and 3: the settings at that total, then one worker fewer.
      while (true) {
        ASSIGN_OR_RETURN(best, Descend(*best));
        const int total = points_[*best].config.workers();
        if (total == 1) break;
        ASSIGN_OR_RETURN(const std::vector<int> fewer,
                         EvaluateAll(Splits(points_[*best].config, total - 1)));
        if (fewer.empty()) break;
        int start_fewer = fewer.front();
        for (int id : fewer) {
          if (Better(points_[id], points_[start_fewer])) start_fewer = id;
        }
        ASSIGN_OR_RETURN(const int cheaper, Descend(start_fewer));
        if (!points_[cheaper].meets) break;
        best = cheaper;
      }
    }
    return Finish(best);
  }

 private:
  // Every split of `n` workers the space allows, with `base`'s settings.
  std::vector<PlanConfig> Splits(const PlanConfig& base, int n) const {
    std::vector<PlanConfig> out;
    for (int p = space_.colocated ? 0 : 1; p <= (space_.disaggregated ? n - 1 : 0); ++p) {
      PlanConfig c = base;
      c.prefill = p;
      c.decode = n - p;
      out.push_back(Normalised(c));
    }
    return out;
  }

  // Settings that do not act in `c` at their first value, so that equal
  // deployments are one point.
  PlanConfig Normalised(PlanConfig c) const {
    if (c.schedule_policy != "chunked")
      c.prefill_chunk_tokens = space_.prefill_chunk_tokens.front();
    if (c.prefill == 0) c.local_prefill_tokens = space_.local_prefill_tokens.front();
    return c;
  }

  // Coordinate descent from point `from` at its total.
  absl::StatusOr<int> Descend(int from) {
    int best = from;
    for (int pass = 0; pass < 4; ++pass) {
      const int before = best;
      std::vector<PlanConfig> tries;
      const PlanConfig& b = points_[best].config;
      auto vary = [&](auto values, auto field) {
        for (const auto& v : values) {
          PlanConfig c = b;
          c.*field = v;
          c = Normalised(c);
          if (!(c == b)) tries.push_back(c);
        }
      };
      vary(space_.schedule_policies, &PlanConfig::schedule_policy);
      vary(space_.prefill_chunk_tokens, &PlanConfig::prefill_chunk_tokens);
      vary(space_.max_batch_tokens, &PlanConfig::max_batch_tokens);
      vary(space_.local_prefill_tokens, &PlanConfig::local_prefill_tokens);
      vary(space_.routing_policies, &PlanConfig::routing_policy);
      vary(space_.kv_dtypes, &PlanConfig::kv_dtype);
      // The other splits of the total with these settings.
      for (const PlanConfig& c : Splits(b, b.workers())) {
        if (!(c == b)) tries.push_back(c);
      }
      ASSIGN_OR_RETURN(std::vector<int> ids, EvaluateAll(tries));
      for (int id : ids) {
        if (Better(points_[id], points_[best])) best = id;
      }
      if (best == before) break;
    }
    return best;
  }

  std::optional<int> BestMeeting(const std::vector<int>& ids) const {
    std::optional<int> best;
    for (int id : ids) {
      if (points_[id].meets && (!best.has_value() || Better(points_[id], points_[*best]))) {
        best = id;
      }
    }
    return best;
  }

  // Evaluates what is not evaluated yet, `jobs_` at once; the points' ids
  // in the order of `configs`.
  absl::StatusOr<std::vector<int>> EvaluateAll(const std::vector<PlanConfig>& configs) {
    std::vector<PlanConfig> todo;
    for (const PlanConfig& c : configs) {
      const std::string key = Key(c);
      if (!index_.contains(key) &&
          std::none_of(todo.begin(), todo.end(), [&](const PlanConfig& t) { return t == c; })) {
        todo.push_back(c);
      }
    }
    std::vector<absl::StatusOr<bench::RunResult>> runs(todo.size(),
                                                       absl::UnknownError("not evaluated"));
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t i = next++; i < todo.size(); i = next++) runs[i] = evaluate_(todo[i]);
    };
    std::vector<std::thread> threads;
    for (int t = 1; t < std::min<int>(jobs_, todo.size()); ++t) threads.emplace_back(work);
    work();
    for (std::thread& t : threads) t.join();
    for (size_t i = 0; i < todo.size(); ++i) {
      if (!runs[i].ok()) {
        return absl::Status(runs[i].status().code(),
                            absl::StrCat(todo[i].Describe(), ": ", runs[i].status().message()));
      }
      index_[Key(todo[i])] = static_cast<int>(points_.size());
      points_.push_back(MakePoint(todo[i], *runs[i], targets_));
    }
    std::vector<int> ids;
    for (const PlanConfig& c : configs) ids.push_back(index_.at(Key(c)));
    return ids;
  }

  PlanResult Finish(std::optional<int> chosen) {
    PlanResult r;
    r.chosen = chosen;
    std::vector<int> order(points_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return Better(points_[a], points_[b]); });
    if (chosen.has_value()) {
      // Rivals: the next best of as many workers, then of more.
      const int total = points_[*chosen].config.workers();
      std::vector<int> others;
      for (int id : order) {
        if (id != *chosen) others.push_back(id);
      }
      std::stable_partition(others.begin(), others.end(),
                            [&](int id) { return points_[id].config.workers() == total; });
      // A setting that changed nothing (the same latencies and goodput) is
      // the chosen deployment again, not a rival.
      auto same = [&](int a, int b) {
        const PlanPoint &p = points_[a], &q = points_[b];
        return p.ttft == q.ttft && p.tpot == q.tpot && p.e2e == q.e2e &&
               p.metrics.goodput == q.metrics.goodput;
      };
      std::vector<int> seen = {*chosen};
      for (int id : others) {
        if (r.rivals.size() == 2) break;
        if (std::any_of(seen.begin(), seen.end(), [&](int s) { return same(s, id); })) continue;
        seen.push_back(id);
        r.rivals.push_back(id);
      }
    } else if (!order.empty()) {
      r.closest = order.front();
    }
    for (size_t i = 0; i < points_.size(); ++i) {
      const PlanPoint& p = points_[i];
      const bool dominated = std::any_of(points_.begin(), points_.end(), [&](const PlanPoint& q) {
        return q.goodput_per_worker >= p.goodput_per_worker && q.slo_ratio <= p.slo_ratio &&
               (q.goodput_per_worker > p.goodput_per_worker || q.slo_ratio < p.slo_ratio);
      });
      if (!dominated) r.frontier.push_back(static_cast<int>(i));
    }
    std::sort(r.frontier.begin(), r.frontier.end(), [&](int a, int b) {
      const PlanPoint &pa = points_[a], &pb = points_[b];
      if (pa.config.workers() != pb.config.workers()) {
        return pa.config.workers() < pb.config.workers();
      }
      return pa.slo_ratio < pb.slo_ratio;
    });
    r.points = std::move(points_);
    return r;
  }

  const PlanSpace& space_;
  const PlanTargets& targets_;
  const PlanEvaluator& evaluate_;
  const int jobs_;
  std::vector<PlanPoint> points_;
  absl::flat_hash_map<std::string, int> index_;
};

absl::Status CheckSpace(const PlanSpace& s, const PlanTargets& t) {
  if (t.slo.empty()) {
    return absl::InvalidArgumentError("give at least one SLO to plan for, e.g. ttft=500,tpot=50");
  }
  if (!(t.percentile > 0 && t.percentile <= 100)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the SLO percentile is ", t.percentile, "; give one in (0, 100]"));
  }
  if (s.max_workers < 1 || s.max_workers > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("the budget is ", s.max_workers, " workers; give 1 to 256"));
  }
  if (!s.colocated && (!s.disaggregated || s.max_workers < 2)) {
    return absl::InvalidArgumentError(
        "the search allows no split: allow colocated workers or a budget of 2 or more with "
        "prefill workers");
  }
  if (s.schedule_policies.empty() || s.prefill_chunk_tokens.empty() || s.max_batch_tokens.empty() ||
      s.local_prefill_tokens.empty() || s.routing_policies.empty() || s.kv_dtypes.empty()) {
    return absl::InvalidArgumentError("every setting the search varies needs at least one value");
  }
  return absl::OkStatus();
}

}  // namespace

std::string PlanConfig::DecodeArgs() const {
  std::string s =
      absl::StrCat("--schedule_policy ", schedule_policy, " --max_batch_tokens ", max_batch_tokens);
  if (schedule_policy == "chunked")
    absl::StrAppend(&s, " --prefill_chunk_tokens ", prefill_chunk_tokens);
  return s;
}

std::string PlanConfig::PrefillArgs() const {
  return prefill == 0 ? "" : absl::StrCat("--max_batch_tokens ", max_batch_tokens);
}

std::string PlanConfig::RouterArgs() const {
  std::string s = absl::StrCat("--routing_policy ", routing_policy);
  if (prefill > 0) absl::StrAppend(&s, " --local_prefill_tokens ", local_prefill_tokens);
  return s;
}

std::string PlanConfig::Describe() const {
  std::string s =
      prefill == 0 ? absl::StrCat(decode, "x colocated") : absl::StrCat(prefill, "P+", decode, "D");
  absl::StrAppend(&s, " ", schedule_policy);
  if (schedule_policy == "chunked") absl::StrAppend(&s, "/", prefill_chunk_tokens);
  absl::StrAppend(&s, " mbt ", max_batch_tokens);
  if (prefill > 0) absl::StrAppend(&s, " local<=", local_prefill_tokens);
  absl::StrAppend(&s, " ", routing_policy);
  if (!kv_dtype.empty()) absl::StrAppend(&s, " kv ", kv_dtype);
  return s;
}

PlanPoint MakePoint(const PlanConfig& config, const bench::RunResult& run,
                    const PlanTargets& targets) {
  PlanPoint p;
  p.config = config;
  p.metrics = run.metrics;
  const double q = targets.percentile;
  p.ttft = LatencyAt(
      run, q, [](const bench::RequestRecord& r) { return r.ttft; }, false);
  p.tpot = LatencyAt(run, q, nullptr, true);
  p.e2e = LatencyAt(
      run, q, [](const bench::RequestRecord& r) { return r.e2e; }, false);
  std::vector<std::string> misses;
  auto check = [&](const char* name, double value, const std::optional<double>& target) {
    if (!target.has_value()) return;
    const double ratio = value / *target;
    p.slo_ratio = std::max(p.slo_ratio, ratio);
    if (ratio > 1) {
      misses.push_back(
          absl::StrFormat("%s p%g %.1f ms > %.1f", name, q, value * 1e3, *target * 1e3));
    }
  };
  check("TTFT", p.ttft, targets.slo.ttft);
  check("TPOT", p.tpot, targets.slo.tpot);
  check("E2E", p.e2e, targets.slo.e2e);
  if (run.metrics.failed > 0) {
    misses.insert(misses.begin(), absl::StrCat(run.metrics.failed, " failed"));
  }
  p.meets = misses.empty();
  p.miss = absl::StrJoin(misses, "; ");
  p.goodput_per_worker = run.metrics.goodput.value_or(0) / std::max(1, config.workers());
  return p;
}

absl::Status ApplyPlanConfig(const PlanConfig& config, const PlanBaseArgs& base_args,
                             SimClusterOptions& options) {
  options.prefill_workers = config.prefill;
  options.decode_workers = config.decode;
  for (const auto& [role, args] : {std::pair{ArgsRole::kDecode, base_args.decode},
                                   std::pair{ArgsRole::kPrefill, base_args.prefill},
                                   std::pair{ArgsRole::kRouter, base_args.router},
                                   std::pair{ArgsRole::kDecode, config.DecodeArgs()},
                                   std::pair{ArgsRole::kPrefill, config.PrefillArgs()},
                                   std::pair{ArgsRole::kRouter, config.RouterArgs()}}) {
    RETURN_IF_ERROR(ApplyClusterArgs(role, args, options));
  }
  return absl::OkStatus();
}

PlanEvaluator SimEvaluator(
    const ModelWeights& weights, const bench::Dataset& dataset, const bench::RunOptions& run,
    std::function<absl::StatusOr<SimClusterOptions>(const std::string& kv_dtype)> base,
    PlanBaseArgs base_args, RouterCpuModel router_cpu) {
  return [&weights, &dataset, run, base = std::move(base), base_args = std::move(base_args),
          router_cpu](const PlanConfig& c) -> absl::StatusOr<bench::RunResult> {
    ASSIGN_OR_RETURN(SimClusterOptions o, base(c.kv_dtype));
    RETURN_IF_ERROR(ApplyPlanConfig(c, base_args, o));
    if (c.prefill == 0) o.router.driver.local_prefill_tokens = weights.config.seq_len;
    ASSIGN_OR_RETURN(std::unique_ptr<SimCluster> cluster,
                     SimCluster::Create(weights, std::move(o)));
    return RunSimulated(*cluster, dataset, run, router_cpu);
  };
}

absl::StatusOr<PlanResult> SearchPlan(const PlanSpace& space, const PlanTargets& targets,
                                      const PlanEvaluator& evaluate, int jobs) {
  RETURN_IF_ERROR(CheckSpace(space, targets));
  return Search(space, targets, evaluate, jobs).Run();
}

}  // namespace tandem::sim
