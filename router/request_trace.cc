// RequestDriver::Log: what a finished request leaves behind, its metrics
// and its JSON trace line.
#include <cstdint>
#include <string>

#include "common/base/logging.h"
#include "common/metrics/metrics.h"
#include "nlohmann/json.hpp"
#include "router/request_driver.h"

namespace tandem::router {

void RequestDriver::Log(const absl::Status& status) const {
  // As the client's Finished.timeline says when it got one.
  const int64_t end_us = timeline_.end_us;
  const bool routed = !decode_address_.empty();
  int completion_tokens = 0;
  for (const Choice& c : choices_) completion_tokens += c.tokens;
  const int tokens0 = choices_.empty() ? 0 : choices_[0].tokens;
  if (RouterMetrics* m = env_.options.metrics; m != nullptr) {
    m->requests.Count(status);
    m->generation_tokens.Increment(completion_tokens);
    if (routed) {
      m->prompt_tokens.Increment(static_cast<double>(req_.prompt.size()));
      (disaggregated_ ? m->disaggregated_requests : m->local_prefill_requests).Increment();
    }
    if (status.ok()) {
      m->e2e_request_latency.Observe(static_cast<double>(end_us) / 1e6);
      if (tokens0 > 1) {
        m->time_per_output_token.Observe(static_cast<double>(end_us - timeline_.first_token_us) /
                                         1e6 / (tokens0 - 1));
      }
    }
  }
  // One JSON object per request: the client's Finished fields plus why it
  // was (not) disaggregated, for tracing latency back to its stages.
  nlohmann::json line = {
      {"request_id", request_id_},
      // When it reached the router (its clock), for replaying the log.
      {"arrival_unix_us", absl::ToUnixMicros(arrival_)},
      {"status", std::string(metrics::OutcomeLabel(status.code()))},
      {"finish_reason", status.ok() && !choices_.empty() && choices_[0].finish.has_value()
                            ? v1::FinishReason_Name(FinishReasonToProto(*choices_[0].finish))
                            : std::string()},
      {"prompt_tokens", req_.prompt.size()},
      {"cached_tokens", cached_tokens_},
      {"tier_cached_tokens", tier_tokens_},
      {"decode_held_tokens", decode_held_tokens_},
      {"kv_bytes", kv_bytes_},
      {"completion_tokens", completion_tokens},
      {"n", choices_.size()},
      {"timeline_us",
       {{"router_queue", timeline_.router_queue_us},
        {"reserve", timeline_.reserve_us},
        {"prefill_call", timeline_.prefill_call_us},
        {"prefill_queue", timeline_.prefill_queue_us},
        {"prefill", timeline_.prefill_us},
        {"kv_transfer", timeline_.kv_transfer_us},
        {"decode_queue", timeline_.decode_queue_us},
        {"first_token", timeline_.first_token_us},
        {"end", end_us}}},
      {"prefill_worker", prefill_address_},
      {"decode_worker", decode_address_},
      {"disaggregated", disaggregated_},
      {"routing", why_.empty() ? "not routed" : why_},
  };
  if (!status.ok()) line["error"] = std::string(status.message());
  if (!prefill_errors_.empty()) line["prefill_errors"] = prefill_errors_;
  if (migrations_ > 0) {
    line["migrations"] = migrations_;
    line["migrated_from"] = migrated_from_;
    if (drain_moves_ > 0) line["drain_moves"] = drain_moves_;
    if (kv_handoffs_ > 0) line["kv_handoffs"] = kv_handoffs_;
  }
  if (!params_.user.empty()) line["user"] = params_.user;
  if (!params_.metadata.empty()) {
    nlohmann::json metadata = nlohmann::json::object();
    for (const auto& [key, value] : params_.metadata) metadata[key] = value;
    line["metadata"] = std::move(metadata);
  }
  // Replace, not throw, on invalid UTF-8 in a worker's error message.
  const std::string text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (env_.options.request_log != nullptr) {
    env_.options.request_log->Write(text);
  } else {
    LOG(INFO) << "request " << text;
  }
}

}  // namespace tandem::router
