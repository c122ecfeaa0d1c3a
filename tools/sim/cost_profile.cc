#include "tools/sim/cost_profile.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem::sim {
namespace {

// fixed; per prompt token; per key a prompt token attends; per logit row;
// per decode row; per key a decode row attends.
constexpr int kTerms = 6;

std::array<double, kTerms> Terms(const StepShape& s) {
  return {1.0,
          static_cast<double>(s.tokens - s.decode_tokens),
          static_cast<double>(s.attended - s.decode_attended),
          static_cast<double>(s.logit_rows),
          static_cast<double>(s.decode_tokens),
          static_cast<double>(s.decode_attended)};
}

// Least squares over the terms in `use` of rows weighted by 1 / seconds
// (relative error), by the normal equations and Gaussian elimination with
// partial pivoting: six unknowns at most, so a linear-algebra library
// would add a dependency for a 6x6 solve. False when they are singular.
bool SolveSubset(const std::vector<ProfilePoint>& points, const std::array<bool, kTerms>& use,
                 std::array<double, kTerms>& coef) {
  std::vector<int> idx;
  for (int t = 0; t < kTerms; ++t) {
    if (use[t]) idx.push_back(t);
  }
  const int n = static_cast<int>(idx.size());
  std::vector<std::vector<double>> a(n, std::vector<double>(n + 1, 0.0));
  for (const ProfilePoint& p : points) {
    const std::array<double, kTerms> x = Terms(p.shape);
    const double w = 1.0 / p.seconds;
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j) a[i][j] += w * w * x[idx[i]] * x[idx[j]];
      a[i][n] += w * w * x[idx[i]] * p.seconds;
    }
  }
  for (int c = 0; c < n; ++c) {
    int pivot = c;
    for (int r = c + 1; r < n; ++r) {
      if (std::abs(a[r][c]) > std::abs(a[pivot][c])) pivot = r;
    }
    if (std::abs(a[pivot][c]) < 1e-300) return false;
    std::swap(a[c], a[pivot]);
    for (int r = 0; r < n; ++r) {
      if (r == c) continue;
      const double f = a[r][c] / a[c][c];
      for (int k = c; k <= n; ++k) a[r][k] -= f * a[c][k];
    }
  }
  coef.fill(0.0);
  for (int i = 0; i < n; ++i) coef[idx[i]] = a[i][n] / a[i][i];
  return true;
}

double RelativeResidual(const std::vector<ProfilePoint>& points,
                        const std::array<double, kTerms>& coef) {
  double sum = 0;
  for (const ProfilePoint& p : points) {
    const std::array<double, kTerms> x = Terms(p.shape);
    double fitted = 0;
    for (int t = 0; t < kTerms; ++t) fitted += coef[t] * x[t];
    const double e = (fitted - p.seconds) / p.seconds;
    sum += e * e;
  }
  return sum;
}

LinearStepCost ToCost(const std::array<double, kTerms>& c) {
  return LinearStepCost{.fixed = absl::Seconds(c[0]),
                        .per_token = absl::Seconds(c[1]),
                        .per_attended = absl::Seconds(c[2]),
                        .per_logit_row = absl::Seconds(c[3]),
                        .per_decode_token = absl::Seconds(c[4]),
                        .per_decode_attended = absl::Seconds(c[5])};
}

// Decode steps timed one after another in each run, as a decode loop runs
// them (weights and KV warm from the step before), after an untimed one.
constexpr int kDecodeSteps = 5;  // Odd: the middle step's shape is the mean.

// Times a step of `step_tokens` over sequences holding `contexts`: the
// median of `repeats` runs after one untimed run, each on fresh tables
// (released after). A decode step (every item one token) is timed as the
// mean of kDecodeSteps in a row, its shape that of the middle one.
absl::StatusOr<ProfilePoint> TimeStep(StepExecutor& executor, Engine& engine, const Clock& clock,
                                      const std::vector<std::vector<int32_t>>& contexts,
                                      const std::vector<std::vector<int32_t>>& step_tokens,
                                      int repeats) {
  const bool decode = std::all_of(step_tokens.begin(), step_tokens.end(),
                                  [](const std::vector<int32_t>& t) { return t.size() == 1; });
  const int timed_steps = decode ? kDecodeSteps : 1;
  ProfilePoint point;
  std::vector<double> runs;
  const auto noop = [](int) {};
  for (int r = 0; r <= repeats; ++r) {
    std::vector<BlockTable> tables(step_tokens.size(), engine.NewSequence());
    absl::Status status;
    // The context each sequence attends to, computed untimed.
    for (size_t i = 0; i < tables.size() && status.ok(); ++i) {
      if (contexts[i].empty()) continue;
      const BatchItem item{&tables[i], contexts[i], false};
      status = executor.Step({&item, 1}, noop).status();
    }
    std::vector<BatchItem> items;
    for (size_t i = 0; i < tables.size(); ++i) items.push_back({&tables[i], step_tokens[i], true});
    if (decode && status.ok()) status = executor.Step(items, noop).status();
    double total = 0;
    for (int s = 0; s < timed_steps && status.ok(); ++s) {
      const StepShape shape = ShapeOf(items);
      const absl::Time t0 = clock.Now();
      status = executor.Step(items, noop).status();
      total += absl::ToDoubleSeconds(clock.Now() - t0);
      if (s == timed_steps / 2) point.shape = shape;
    }
    for (BlockTable& t : tables) engine.Release(t);
    RETURN_IF_ERROR(status);
    if (r > 0) runs.push_back(total / timed_steps);
  }
  // The median run: a server's steps are typical ones, not the fastest.
  std::sort(runs.begin(), runs.end());
  point.seconds = runs[runs.size() / 2];
  return point;
}

std::vector<int32_t> Tokens(int n, int salt, int vocab) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 7919 + salt * 104729 + 13) % vocab);
  return t;
}

}  // namespace

absl::StatusOr<LinearStepCost> FitLinear(const std::vector<ProfilePoint>& points) {
  if (points.empty()) return absl::InvalidArgumentError("no profile points to fit");
  for (const ProfilePoint& p : points) {
    if (!(p.seconds > 0) || !std::isfinite(p.seconds)) {
      return absl::InvalidArgumentError(
          absl::StrCat("a profile point took ", p.seconds, " s; times must be positive"));
    }
  }
  std::array<double, kTerms> best{};
  double best_residual = std::numeric_limits<double>::infinity();
  for (int mask = 1; mask < (1 << kTerms); ++mask) {
    std::array<bool, kTerms> use{};
    for (int t = 0; t < kTerms; ++t) use[t] = (mask >> t) & 1;
    std::array<double, kTerms> coef{};
    if (!SolveSubset(points, use, coef)) continue;
    if (std::any_of(coef.begin(), coef.end(), [](double c) { return c < 0; })) continue;
    const double residual = RelativeResidual(points, coef);
    if (residual < best_residual) {
      best_residual = residual;
      best = coef;
    }
  }
  if (!std::isfinite(best_residual)) {
    return absl::InvalidArgumentError("the profile points admit no non-negative linear fit");
  }
  return ToCost(best);
}

int ProfileBlocks(const ProfileGrid& grid, int block_size) {
  int most = 0;
  for (int p : grid.prompt_tokens) most = std::max(most, (p + block_size - 1) / block_size);
  for (int b : grid.decode_batches) {
    for (int c : grid.decode_contexts) {
      const int tokens = c + 1 + kDecodeSteps;
      most = std::max(most, b * ((tokens + block_size - 1) / block_size));
    }
  }
  return most;
}

absl::StatusOr<CostProfile> MeasureProfile(StepExecutor& executor, Engine& engine,
                                           const Clock& clock, const ProfileGrid& grid) {
  const ModelConfig& config = engine.config();
  const int vocab = config.vocab_size;
  if (grid.repeats < 1) return absl::InvalidArgumentError("repeats must be at least 1");
  for (int p : grid.prompt_tokens) {
    if (p < 1 || p >= config.seq_len) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a prompt chunk of ", p, " tokens does not fit the model's context of ", config.seq_len));
    }
  }
  for (int c : grid.decode_contexts) {
    if (c < 1 || c + 1 + kDecodeSteps >= config.seq_len) {
      return absl::InvalidArgumentError(absl::StrCat("a decode context of ", c,
                                                     " tokens does not fit the model's context of ",
                                                     config.seq_len));
    }
  }
  const int needed = ProfileBlocks(grid, engine.kv_layout().block_size);
  if (needed > engine.block_pool().num_blocks()) {
    return absl::InvalidArgumentError(absl::StrCat("the grid needs ", needed,
                                                   " KV blocks at once; the pool has ",
                                                   engine.block_pool().num_blocks()));
  }
  CostProfile profile;
  profile.config = config;
  for (int p : grid.prompt_tokens) {
    ASSIGN_OR_RETURN(ProfilePoint point,
                     TimeStep(executor, engine, clock, {{}}, {Tokens(p, 1, vocab)}, grid.repeats));
    profile.points.push_back(point);
  }
  for (int c : grid.decode_contexts) {
    for (int b : grid.decode_batches) {
      std::vector<std::vector<int32_t>> contexts, step;
      for (int i = 0; i < b; ++i) {
        contexts.push_back(Tokens(c, i + 2, vocab));
        step.push_back({static_cast<int32_t>((i * 31 + 7) % vocab)});
      }
      ASSIGN_OR_RETURN(ProfilePoint point,
                       TimeStep(executor, engine, clock, contexts, step, grid.repeats));
      profile.points.push_back(point);
    }
  }
  ASSIGN_OR_RETURN(profile.fit, FitLinear(profile.points));
  std::vector<double> errors;
  for (const ProfilePoint& p : profile.points) {
    const double fitted = absl::ToDoubleSeconds(profile.fit(p.shape));
    errors.push_back(std::abs(fitted - p.seconds) / p.seconds);
  }
  std::sort(errors.begin(), errors.end());
  profile.median_error = errors[errors.size() / 2];
  profile.max_error = errors.back();
  return profile;
}

nlohmann::json ProfileJson(const CostProfile& profile) {
  nlohmann::json points = nlohmann::json::array();
  for (const ProfilePoint& p : profile.points) {
    points.push_back({{"items", p.shape.items},
                      {"tokens", p.shape.tokens},
                      {"attended", p.shape.attended},
                      {"logit_rows", p.shape.logit_rows},
                      {"decode_tokens", p.shape.decode_tokens},
                      {"decode_attended", p.shape.decode_attended},
                      {"seconds", p.seconds}});
  }
  const ModelConfig& c = profile.config;
  return {
      {"backend", profile.backend},
      {"threads", profile.threads},
      {"weights_dtype", profile.weights_dtype},
      {"model",
       {{"dim", c.dim},
        {"hidden_dim", c.hidden_dim},
        {"n_layers", c.n_layers},
        {"n_heads", c.n_heads},
        {"n_kv_heads", c.n_kv_heads},
        {"vocab_size", c.vocab_size},
        {"seq_len", c.seq_len}}},
      {"points", points},
      {"fit",
       {{"model", "linear"},
        {"fixed_s", absl::ToDoubleSeconds(profile.fit.fixed)},
        {"per_token_s", absl::ToDoubleSeconds(profile.fit.per_token)},
        {"per_attended_s", absl::ToDoubleSeconds(profile.fit.per_attended)},
        {"per_logit_row_s", absl::ToDoubleSeconds(profile.fit.per_logit_row)},
        {"per_decode_token_s",
         absl::ToDoubleSeconds(profile.fit.per_decode_token.value_or(profile.fit.per_token))},
        {"per_decode_attended_s",
         absl::ToDoubleSeconds(profile.fit.per_decode_attended.value_or(profile.fit.per_attended))},
        {"median_error", profile.median_error},
        {"max_error", profile.max_error}}}};
}

absl::StatusOr<CostProfile> ParseProfile(const nlohmann::json& json) {
  CostProfile p;
  try {
    p.backend = json.at("backend").get<std::string>();
    p.threads = json.at("threads").get<int>();
    p.weights_dtype = json.at("weights_dtype").get<std::string>();
    const nlohmann::json& m = json.at("model");
    p.config.dim = m.at("dim").get<int>();
    p.config.hidden_dim = m.at("hidden_dim").get<int>();
    p.config.n_layers = m.at("n_layers").get<int>();
    p.config.n_heads = m.at("n_heads").get<int>();
    p.config.n_kv_heads = m.at("n_kv_heads").get<int>();
    p.config.vocab_size = m.at("vocab_size").get<int>();
    p.config.seq_len = m.at("seq_len").get<int>();
    for (const nlohmann::json& e : json.at("points")) {
      p.points.push_back(
          ProfilePoint{.shape = {.items = e.at("items").get<int>(),
                                 .tokens = e.at("tokens").get<int>(),
                                 .attended = e.at("attended").get<int64_t>(),
                                 .logit_rows = e.at("logit_rows").get<int>(),
                                 .decode_tokens = e.at("decode_tokens").get<int>(),
                                 .decode_attended = e.at("decode_attended").get<int64_t>()},
                       .seconds = e.at("seconds").get<double>()});
    }
    const nlohmann::json& f = json.at("fit");
    if (f.at("model").get<std::string>() != "linear") {
      return absl::InvalidArgumentError("the profile's fit is not a linear model");
    }
    const double c[] = {f.at("fixed_s").get<double>(),
                        f.at("per_token_s").get<double>(),
                        f.at("per_attended_s").get<double>(),
                        f.at("per_logit_row_s").get<double>(),
                        f.at("per_decode_token_s").get<double>(),
                        f.at("per_decode_attended_s").get<double>()};
    for (double v : c) {
      if (!(v >= 0) || !std::isfinite(v)) {
        return absl::InvalidArgumentError("the profile's fit has a negative or non-finite cost");
      }
    }
    p.fit = ToCost({c[0], c[1], c[2], c[3], c[4], c[5]});
    p.median_error = f.at("median_error").get<double>();
    p.max_error = f.at("max_error").get<double>();
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("malformed cost profile: ", e.what()));
  }
  return p;
}

absl::Status CheckProfileShape(const CostProfile& profile, const ModelConfig& config) {
  const ModelConfig& p = profile.config;
  if (p.dim != config.dim || p.hidden_dim != config.hidden_dim || p.n_layers != config.n_layers ||
      p.n_heads != config.n_heads || p.n_kv_heads != config.n_kv_heads ||
      p.vocab_size != config.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the profile was measured on a model of dim ", p.dim, ", hidden ", p.hidden_dim, ", ",
        p.n_layers, " layers, ", p.n_heads, "/", p.n_kv_heads, " heads and a vocabulary of ",
        p.vocab_size, "; the simulated workers hold dim ", config.dim, ", hidden ",
        config.hidden_dim, ", ", config.n_layers, " layers, ", config.n_heads, "/",
        config.n_kv_heads, " heads and ", config.vocab_size,
        ": profile the shape you simulate (tandem-profile)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<StepCostFn> ScaleCost(StepCostFn cost, double scale) {
  if (!(scale > 0 && scale <= 100)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the step scale is ", scale, "; give a factor above 0, at most 100"));
  }
  return StepCostFn(
      [cost = std::move(cost), scale](const StepShape& step) { return cost(step) * scale; });
}

}  // namespace tandem::sim
