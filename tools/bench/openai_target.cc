// An OpenAI-compatible server's streaming /v1/completions (vLLM, SGLang,
// llama.cpp server...): one SSE chunk with text is one token, unless the
// server reports usage, as vLLM's bench client counts them.
#include <httplib.h>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "tools/bench/sse.h"
#include "tools/bench/target.h"

namespace tandem::bench {
namespace {

class OpenAiTarget : public Target {
 public:
  OpenAiTarget(std::string host, int port, std::string path, const TargetOptions& options)
      : host_(std::move(host)), port_(port), path_(std::move(path)), options_(options) {}

  RequestRecord Send(const BenchRequest& request) override {
    nlohmann::json body = {{"prompt", request.prompt},
                           {"max_tokens", request.max_tokens},
                           {"temperature", 0.0},
                           {"stream", true},
                           {"stream_options", {{"include_usage", true}}}};
    if (!options_.model.empty()) body["model"] = options_.model;
    if (options_.ignore_eos) body["ignore_eos"] = true;

    RequestRecord r;
    std::string error;
    std::string raw;  // the start of the body, for error messages
    int usage_completion = -1, usage_prompt = -1;
    bool done = false;
    StreamTimer timer;
    SseParser parser([&](std::string_view data) {
      if (data == "[DONE]") {
        done = true;
        return;
      }
      const nlohmann::json j = nlohmann::json::parse(data, nullptr, false);
      if (j.is_discarded()) {
        if (error.empty())
          error = absl::StrCat("bad SSE chunk: ", std::string(data.substr(0, 120)));
        return;
      }
      if (j.contains("error") && error.empty()) error = j["error"].dump().substr(0, 200);
      if (auto c = j.find("choices"); c != j.end() && c->is_array() && !c->empty()) {
        const auto& text = (*c)[0].find("text");
        if (text != (*c)[0].end() && text->is_string() &&
            !text->get_ref<const std::string&>().empty()) {
          timer.OnTokens(1);
        }
      }
      if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
        usage_completion = u->value("completion_tokens", usage_completion);
        usage_prompt = u->value("prompt_tokens", usage_prompt);
      }
    });

    httplib::Client client(host_, port_);
    client.set_keep_alive(false);
    const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(options_.timeout_s * 1e3));
    client.set_read_timeout(timeout);
    client.set_write_timeout(timeout);
    httplib::Request req;
    req.method = "POST";
    req.path = path_;
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    req.set_header("Accept", "text/event-stream");
    req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
      if (raw.size() < 300) raw.append(data, std::min<size_t>(len, 300 - raw.size()));
      parser.Feed(std::string_view(data, len));
      return true;
    };
    httplib::Response res;
    httplib::Error err = httplib::Error::Success;
    const bool sent = client.send(req, res, err);
    timer.Finish(r);
    if (usage_completion >= 0) r.output_tokens = usage_completion;
    r.prompt_tokens = usage_prompt >= 0 ? usage_prompt : request.prompt_len;
    if (!sent) {
      r.error = absl::StrCat("HTTP request failed: ", httplib::to_string(err));
    } else if (res.status != 200) {
      r.error = absl::StrCat("HTTP ", res.status, ": ", raw.empty() ? res.body : raw);
    } else if (!error.empty()) {
      r.error = error;
    } else if (timer.tokens() == 0) {
      r.error = done ? "the stream ended without tokens" : "the stream ended without [DONE]";
    } else {
      r.success = true;
    }
    return r;
  }

 private:
  std::string host_;
  int port_;
  std::string path_;
  TargetOptions options_;
};

}  // namespace

std::unique_ptr<Target> MakeOpenAiTarget(const std::string& host, int port, const std::string& path,
                                         const TargetOptions& options) {
  return std::make_unique<OpenAiTarget>(host, port, path, options);
}

}  // namespace tandem::bench
