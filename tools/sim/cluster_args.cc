#include "tools/sim/cluster_args.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/marshalling.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/base/status_macros.h"
#include "decode_worker/schedule_policy.h"
#include "router/prefix_routing.h"

namespace tandem::sim {
namespace {

// One flag the simulator models: its name, whether it is a bool (then
// "--name" and "--noname" stand alone), and what its value does.
struct Setting {
  std::string name;
  bool is_bool = false;
  std::function<absl::Status(absl::string_view)> set;
};

// A setting that parses its value as absl's flags do, then checks it.
template <typename T>
Setting Typed(std::string name, std::function<absl::Status(const T&)> apply) {
  const bool is_bool = std::is_same_v<T, bool>;
  return Setting{
      name, is_bool, [name, apply](absl::string_view text) -> absl::Status {
        T value{};
        std::string error;
        if (!absl::ParseFlag<T>(text, &value, &error)) {
          return absl::InvalidArgumentError(absl::StrCat("--", name, "=", text, ": ", error));
        }
        return apply(value);
      }};
}

// Stores an int of at least `min` in `field`.
Setting Int(std::string name, int* field, int min) {
  return Typed<int>(name, [name, field, min](const int& v) {
    if (v < min) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, " is ", v, "; give ", min, " or more"));
    }
    *field = v;
    return absl::OkStatus();
  });
}

Setting Bool(std::string name, bool* field) {
  return Typed<bool>(name, [field](const bool& v) {
    *field = v;
    return absl::OkStatus();
  });
}

Setting PositiveDuration(std::string name, absl::Duration* field) {
  return Typed<absl::Duration>(name, [name, field](const absl::Duration& v) {
    if (v <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " must be positive, e.g. 1s"));
    }
    *field = v;
    return absl::OkStatus();
  });
}

std::vector<Setting> DecodeSettings(decode::DecodeLoopOptions& o) {
  return {Int("kv_blocks", &o.kv_blocks, 0),
          Int("kv_watermark_blocks", &o.kv_watermark_blocks, -1),
          Int("block_size", &o.block_size, 1),
          Bool("prefix_cache", &o.prefix_cache),
          Int("max_batch_tokens", &o.max_batch_tokens, 1),
          Typed<std::string>("schedule_policy",
                             [&o](const std::string& v) -> absl::Status {
                               ASSIGN_OR_RETURN(o.schedule_policy, decode::ParseSchedulePolicy(v));
                               return absl::OkStatus();
                             }),
          Int("prefill_chunk_tokens", &o.prefill_chunk_tokens, 1),
          Int("max_sequences", &o.max_sequences, 1)};
}

std::vector<Setting> PrefillSettings(prefill::PrefillLoopOptions& o) {
  return {Int("kv_blocks", &o.kv_blocks, 0), Int("block_size", &o.block_size, 1),
          Bool("prefix_cache", &o.prefix_cache), Int("max_batch_tokens", &o.max_batch_tokens, 1),
          Int("max_queue", &o.max_queue, 1)};
}

std::vector<Setting> RouterSettings(SimClusterOptions& o) {
  router::RouterCoreOptions& r = o.router;
  // The load a request counts for in prefix routing, kept across the
  // flags' order: the router is made when both are known.
  auto load_tokens = std::make_shared<int>(
      r.driver.prefix_router != nullptr ? r.driver.prefix_router->options().load_tokens : 256);
  auto remake = [&r, load_tokens] {
    if (r.driver.prefix_router != nullptr) {
      r.driver.prefix_router = std::make_shared<router::PrefixRouter>(
          router::PrefixRoutingOptions{.load_tokens = *load_tokens});
    }
  };
  return {
      Int("local_prefill_tokens", &r.driver.local_prefill_tokens, 0),
      Int("prefill_burst_queue", &r.driver.prefill_burst_queue, 0),
      Typed<std::string>("routing_policy",
                         [&r, remake](const std::string& v) {
                           if (v != "prefix" && v != "load") {
                             return absl::InvalidArgumentError(absl::StrCat(
                                 "--routing_policy is '", v, "'; give prefix or load"));
                           }
                           r.driver.prefix_router = nullptr;
                           if (v == "prefix") {
                             r.driver.prefix_router = std::make_shared<router::PrefixRouter>();
                             remake();
                           }
                           return absl::OkStatus();
                         }),
      Typed<int>("prefix_routing_load_tokens",
                 [load_tokens, remake](const int& v) {
                   if (v < 0) {
                     return absl::InvalidArgumentError("--prefix_routing_load_tokens must be >= 0");
                   }
                   *load_tokens = v;
                   remake();
                   return absl::OkStatus();
                 }),
      PositiveDuration("health_interval", &o.poll_interval),
      Int("max_inflight", &r.max_inflight, 1),
      Int("max_queued", &r.max_queued, 0),
      PositiveDuration("queue_timeout", &r.queue_timeout)};
}

const char* RoleName(ArgsRole role) {
  switch (role) {
    case ArgsRole::kDecode:
      return "decode worker";
    case ArgsRole::kPrefill:
      return "prefill worker";
    case ArgsRole::kRouter:
      return "router";
  }
  return "";
}

}  // namespace

absl::Status ApplyClusterArgs(ArgsRole role, absl::string_view args, SimClusterOptions& options) {
  std::vector<Setting> settings;
  switch (role) {
    case ArgsRole::kDecode:
      settings = DecodeSettings(options.decode);
      break;
    case ArgsRole::kPrefill:
      settings = PrefillSettings(options.prefill);
      break;
    case ArgsRole::kRouter:
      settings = RouterSettings(options);
      break;
  }
  auto find = [&](absl::string_view name) -> const Setting* {
    for (const Setting& s : settings) {
      if (s.name == name) return &s;
    }
    return nullptr;
  };
  auto unknown = [&](absl::string_view name) {
    std::vector<std::string> names;
    for (const Setting& s : settings) names.push_back("--" + s.name);
    return absl::InvalidArgumentError(absl::StrCat("tandem-sim does not model the ", RoleName(role),
                                                   "'s --", name, "; it models ",
                                                   absl::StrJoin(names, ", ")));
  };
  const std::vector<std::string> words = absl::StrSplit(args, ' ', absl::SkipEmpty());
  for (size_t i = 0; i < words.size(); ++i) {
    absl::string_view word = words[i];
    if (!absl::StartsWith(word, "--") || word.size() == 2) {
      return absl::InvalidArgumentError(absl::StrCat("the ", RoleName(role), "'s arguments hold '",
                                                     word, "' where a --flag belongs"));
    }
    word.remove_prefix(2);
    const size_t eq = word.find('=');
    const absl::string_view name = word.substr(0, eq);
    const Setting* s = find(name);
    if (s == nullptr && eq == absl::string_view::npos && absl::StartsWith(name, "no")) {
      const Setting* negated = find(name.substr(2));
      if (negated != nullptr && negated->is_bool) {
        RETURN_IF_ERROR(negated->set("false"));
        continue;
      }
    }
    if (s == nullptr) return unknown(name);
    if (eq != absl::string_view::npos) {
      RETURN_IF_ERROR(s->set(word.substr(eq + 1)));
    } else if (s->is_bool) {
      RETURN_IF_ERROR(s->set("true"));
    } else if (i + 1 < words.size()) {
      RETURN_IF_ERROR(s->set(words[++i]));
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::sim
