#include "router/openai_routes.h"

#include <algorithm>
#include <random>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "router/openai_api.h"

namespace tandem::router {
namespace {

using nlohmann::json;
using openai_api::Dump;

std::vector<HttpHeader> With(std::vector<HttpHeader> headers, absl::string_view content_type) {
  headers.push_back({"Content-Type", std::string(content_type)});
  return headers;
}

void RespondJson(HttpExchange& ex, int status, const json& body, std::vector<HttpHeader> cors) {
  ex.Respond(status, With(std::move(cors), "application/json"), Dump(body));
}

void RespondError(HttpExchange& ex, const absl::Status& status, std::vector<HttpHeader> cors) {
  const openai_api::HttpError e = openai_api::ErrorFor(status);
  if (e.http_status == 429) cors.push_back({"Retry-After", "1"});
  if (e.http_status == 401) cors.push_back({"WWW-Authenticate", "Bearer"});
  RespondJson(ex, e.http_status, e.body, std::move(cors));
}

std::string NewId(absl::string_view prefix) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return absl::StrFormat("%s-%016x%08x", prefix, rng(), static_cast<uint32_t>(rng()));
}

constexpr size_t kMaxRequestIdBytes = 128;

// The client's X-Request-Id: "" when absent, an error when it is not an id
// the logs and the workers' request ids can carry.
absl::StatusOr<std::string> ClientRequestId(const HttpExchange& ex) {
  const absl::string_view id = ex.Header("X-Request-Id");
  if (id.empty()) return std::string();
  const bool valid =
      id.size() <= kMaxRequestIdBytes && std::all_of(id.begin(), id.end(), [](char c) {
        return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == ':' || c == '-';
      });
  if (!valid) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the X-Request-Id header must be 1 to ", kMaxRequestIdBytes,
        " characters of A-Z, a-z, 0-9, '.', '_', ':' and '-'; change it or leave it out"));
  }
  return std::string(id);
}

// A non-streamed response: collects the events, answers at OnDone.
class WholeSink final : public ResponseSink {
 public:
  WholeSink(std::shared_ptr<HttpExchange> ex, openai_api::ResponseMeta meta,
            std::vector<HttpHeader> cors)
      : ex_(std::move(ex)), builder_(std::move(meta)), cors_(std::move(cors)) {}

  bool OnEvent(GenerateEvent event) override {
    absl::MutexLock lock(&mu_);
    if (failure_.ok()) failure_ = builder_.Add(event);
    return failure_.ok() && !ex_->client_gone();
  }

  void OnDone(absl::Status status) override {
    absl::MutexLock lock(&mu_);
    if (!failure_.ok()) status = failure_;
    if (!status.ok()) {
      RespondError(*ex_, status, std::move(cors_));
    } else {
      RespondJson(*ex_, 200, builder_.Build(), std::move(cors_));
    }
    ex_.reset();
  }

 private:
  // Sink calls never overlap; the mutex only orders them across threads.
  absl::Mutex mu_;
  std::shared_ptr<HttpExchange> ex_ ABSL_GUARDED_BY(mu_);
  openai_api::ResponseBuilder builder_ ABSL_GUARDED_BY(mu_);
  std::vector<HttpHeader> cors_ ABSL_GUARDED_BY(mu_);
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
};

// A streamed response: SSE chunks as events come. The headers wait for the
// first event so that a refused request gets its own status.
class StreamSink final : public ResponseSink {
 public:
  StreamSink(std::shared_ptr<HttpExchange> ex, openai_api::ResponseMeta meta,
             std::vector<HttpHeader> cors)
      : ex_(std::move(ex)), builder_(std::move(meta)), cors_(std::move(cors)) {}

  bool OnEvent(GenerateEvent event) override {
    absl::MutexLock lock(&mu_);
    if (!failure_.ok()) return false;
    StartLocked();
    absl::StatusOr<std::string> sse = builder_.OnEvent(event);
    if (!sse.ok()) {
      failure_ = sse.status();
      return false;
    }
    if (!sse->empty()) return ex_->Write(*std::move(sse));
    return !ex_->client_gone();
  }

  void OnDone(absl::Status status) override {
    absl::MutexLock lock(&mu_);
    if (!failure_.ok()) status = failure_;
    if (!started_ && !status.ok()) {
      RespondError(*ex_, status, std::move(cors_));
    } else {
      StartLocked();
      ex_->Write(status.ok() ? builder_.Finish() : openai_api::StreamBuilder::Failure(status));
      ex_->End();
    }
    ex_.reset();
  }

 private:
  void StartLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (started_) return;
    started_ = true;
    std::vector<HttpHeader> headers = With(std::move(cors_), "text/event-stream");
    headers.push_back({"Cache-Control", "no-cache"});
    headers.push_back({"X-Accel-Buffering", "no"});
    ex_->StartStream(200, std::move(headers));
    if (std::string start = builder_.Start(); !start.empty()) ex_->Write(std::move(start));
  }

  absl::Mutex mu_;
  std::shared_ptr<HttpExchange> ex_ ABSL_GUARDED_BY(mu_);
  openai_api::StreamBuilder builder_ ABSL_GUARDED_BY(mu_);
  std::vector<HttpHeader> cors_ ABSL_GUARDED_BY(mu_);
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

OpenAiRoutes::OpenAiRoutes(RequestCore* core, ApiKeys keys, OpenAiRoutesOptions options)
    : core_(core), keys_(std::move(keys)), options_(std::move(options)) {}

HttpHandler OpenAiRoutes::Handler() const {
  return [this](std::shared_ptr<HttpExchange> ex) { Handle(std::move(ex)); };
}

std::vector<HttpHeader> OpenAiRoutes::CorsHeaders(const HttpExchange& ex) const {
  const absl::string_view origin = ex.Header("Origin");
  if (origin.empty()) return {};
  const auto& allowed = options_.allowed_origins;
  if (std::find(allowed.begin(), allowed.end(), "*") == allowed.end() &&
      std::find(allowed.begin(), allowed.end(), origin) == allowed.end()) {
    return {};
  }
  return {{"Access-Control-Allow-Origin", std::string(origin)}, {"Vary", "Origin"}};
}

void OpenAiRoutes::Preflight(HttpExchange& ex, std::vector<HttpHeader> cors) const {
  if (!ex.Header("Origin").empty() && cors.empty()) {
    RespondError(ex,
                 absl::PermissionDeniedError(absl::StrCat("the origin '", ex.Header("Origin"),
                                                          "' is not allowed (--allowed_origins)")),
                 {});
    return;
  }
  const absl::string_view asked = ex.Header("Access-Control-Request-Headers");
  cors.push_back({"Access-Control-Allow-Methods", "GET, POST, OPTIONS"});
  cors.push_back({"Access-Control-Allow-Headers",
                  asked.empty() ? std::string("Authorization, Content-Type") : std::string(asked)});
  cors.push_back({"Access-Control-Max-Age", "600"});
  ex.Respond(204, std::move(cors), "");
}

absl::Status OpenAiRoutes::CheckModel(const std::string& model) const {
  if (model.empty()) return absl::OkStatus();
  const std::string served = core_->ModelInfo().id;
  if (model == served) return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat("the model '", model, "' is not served here; '", served,
                                          "' is (GET /v1/models)"));
}

void OpenAiRoutes::Handle(std::shared_ptr<HttpExchange> ex) const {
  // The headers every response carries: CORS, and the request id.
  std::vector<HttpHeader> cors = CorsHeaders(*ex);
  const absl::string_view path = ex->path();
  // HEAD is GET without the body (the server leaves the body out).
  const std::string method = ex->method() == "HEAD" ? std::string("GET") : ex->method();
  if (method == "OPTIONS") {
    Preflight(*ex, std::move(cors));
    return;
  }
  const bool chat = path == "/v1/chat/completions";
  const bool generation = chat || path == "/v1/completions";
  Ids ids{.completion = generation ? NewId(chat ? "chatcmpl" : "cmpl") : std::string()};
  absl::StatusOr<std::string> client_id = ClientRequestId(*ex);
  if (!client_id.ok()) {
    cors.push_back({"X-Request-Id", NewId("req")});
    RespondError(*ex, client_id.status(), std::move(cors));
    return;
  }
  ids.request = !client_id->empty() ? *std::move(client_id)
                : generation        ? ids.completion
                                    : NewId("req");
  cors.push_back({"X-Request-Id", ids.request});
  if (path == "/health") {
    if (method != "GET") {
      cors.push_back({"Allow", "GET, HEAD"});
      RespondJson(*ex, 405,
                  openai_api::ErrorFor(
                      absl::InvalidArgumentError(absl::StrCat(method, " is not served on /health")))
                      .body,
                  std::move(cors));
    } else if (core_->Serving()) {
      ex->Respond(200, With(std::move(cors), "text/plain"), "ok");
    } else {
      ex->Respond(503, With(std::move(cors), "text/plain"), "not serving");
    }
    return;
  }
  if (keys_.enabled() && !keys_.CheckAuthorization(ex->Header("Authorization"))) {
    RespondError(*ex,
                 absl::UnauthenticatedError(
                     "a valid API key is required: send \"Authorization: Bearer <key>\""),
                 std::move(cors));
    return;
  }
  struct Route {
    absl::string_view method;
    absl::string_view path;  // a trailing '/' matches the path's prefix
  };
  static constexpr Route kRoutes[] = {
      {"POST", "/v1/completions"}, {"POST", "/v1/chat/completions"},
      {"GET", "/v1/models"},       {"GET", "/v1/models/"},
      {"POST", "/tokenize"},       {"POST", "/detokenize"},
      {"GET", "/version"},
  };
  const Route* route = nullptr;
  bool path_known = false;
  for (const Route& r : kRoutes) {
    const bool match = r.path.back() == '/'
                           ? absl::StartsWith(path, r.path) && path.size() > r.path.size()
                           : path == r.path;
    if (!match) continue;
    path_known = true;
    if (method == r.method) route = &r;
  }
  if (route == nullptr) {
    if (path_known) {
      cors.push_back({"Allow", "GET, HEAD, POST, OPTIONS"});
      ex->Respond(405, With(std::move(cors), "application/json"),
                  Dump(openai_api::ErrorFor(absl::InvalidArgumentError(
                                                absl::StrCat(method, " is not served on ", path)))
                           .body));
      return;
    }
    RespondError(*ex,
                 absl::NotFoundError(absl::StrCat(
                     "no route ", method, " ", path,
                     "; served: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, "
                     "GET /v1/models/{id}, POST /tokenize, POST /detokenize, GET /version, GET "
                     "/health")),
                 std::move(cors));
    return;
  }
  if (route->path == "/v1/completions" || route->path == "/v1/chat/completions") {
    Generate(std::move(ex), chat, std::move(ids), std::move(cors));
  } else if (route->path == "/v1/models") {
    Models(*ex, "", std::move(cors));
  } else if (route->path == "/v1/models/") {
    Models(*ex, path.substr(route->path.size()), std::move(cors));
  } else if (route->path == "/tokenize") {
    const size_t bytes = ex->body().size();
    Offload([this, ex, cors = std::move(cors)]() mutable { Tokenize(*ex, std::move(cors)); },
            bytes);
  } else if (route->path == "/detokenize") {
    Offload([this, ex, cors = std::move(cors)]() mutable { Detokenize(*ex, std::move(cors)); });
  } else {
    RespondJson(*ex, 200, {{"version", options_.version}}, std::move(cors));
  }
}

void OpenAiRoutes::Models(HttpExchange& ex, absl::string_view id,
                          std::vector<HttpHeader> cors) const {
  const ServedModelInfo info = core_->ModelInfo();
  json model = {
      {"id", info.id}, {"object", "model"}, {"created", info.created_unix}, {"owned_by", "tandem"}};
  if (info.max_context > 0) model["max_model_len"] = info.max_context;
  if (id.empty()) {
    RespondJson(ex, 200, {{"object", "list"}, {"data", json::array({std::move(model)})}},
                std::move(cors));
  } else if (id == info.id) {
    RespondJson(ex, 200, model, std::move(cors));
  } else {
    RespondError(ex, CheckModel(std::string(id)), std::move(cors));
  }
}

void OpenAiRoutes::Offload(std::function<void()> work, size_t body_bytes) const {
  Executor* executor = options_.executor;
  if (body_bytes > options_.inline_body_bytes && options_.large_executor != nullptr) {
    executor = options_.large_executor;
  }
  if (executor == nullptr) {
    work();
  } else {
    executor->Post(std::move(work));
  }
}

void OpenAiRoutes::Generate(std::shared_ptr<HttpExchange> ex, bool chat, Ids ids,
                            std::vector<HttpHeader> cors) const {
  if (ex->body().size() <= options_.inline_body_bytes) {
    ParseAndSubmit(std::move(ex), chat, std::move(ids), std::move(cors));
    return;
  }
  // A large body (up to the server's max_body_bytes) takes milliseconds to
  // parse: not on an io thread. The client's going away is noticed once
  // the request is submitted.
  const size_t bytes = ex->body().size();
  Offload(
      [this, ex = std::move(ex), chat, ids = std::move(ids), cors = std::move(cors)]() mutable {
        ParseAndSubmit(std::move(ex), chat, std::move(ids), std::move(cors));
      },
      bytes);
}

void OpenAiRoutes::ParseAndSubmit(std::shared_ptr<HttpExchange> ex, bool chat, Ids ids,
                                  std::vector<HttpHeader> cors) const {
  absl::StatusOr<openai_api::ApiRequest> parsed =
      chat ? openai_api::ParseChatRequest(ex->body())
           : openai_api::ParseCompletionRequest(ex->body());
  if (!parsed.ok()) {
    RespondError(*ex, parsed.status(), std::move(cors));
    return;
  }
  GenerateParams& params = parsed->params;
  RequestCore* core = core_;
  openai_api::ResponseMeta meta{
      .endpoint = parsed->endpoint,
      .id = std::move(ids.completion),
      .created = absl::ToUnixSeconds(absl::Now()),
      .model = params.model.empty() ? core->ModelInfo().id : params.model,
      .n = params.n,
      .logprobs = params.logprobs.has_value(),
      .include_usage = parsed->include_usage,
      .token_text =
          [core](int32_t id) {
            absl::StatusOr<std::string> text = core->Detokenize({id});
            return text.ok() ? *std::move(text) : std::string();
          },
  };
  if (chat && params.tool_choice != ToolChoiceKind::kNone) {
    meta.tool_format = core->ModelInfo().tool_format;
    meta.tool_call_id = NewToolCallIds(meta.tool_format);
    meta.parallel_tool_calls = params.parallel_tool_calls;
  }
  if (chat && core->ModelInfo().thinking) {
    meta.reasoning = true;
    meta.thinking_open = core->ChatPromptOpensThinking(params.chat_template_kwargs);
  }
  params.request_id = std::move(ids.request);
  params.timeout = options_.request_timeout;
  std::shared_ptr<ResponseSink> sink;
  if (parsed->stream) {
    sink = std::make_shared<StreamSink>(ex, std::move(meta), std::move(cors));
  } else {
    sink = std::make_shared<WholeSink>(ex, std::move(meta), std::move(cors));
  }
  std::shared_ptr<RequestHandle> handle = core->Submit(std::move(params), std::move(sink));
  if (handle != nullptr) ex->OnClientGone([handle] { handle->Cancel(); });
}

void OpenAiRoutes::Tokenize(HttpExchange& ex, std::vector<HttpHeader> cors) const {
  absl::StatusOr<openai_api::TokenizeRequest> r = openai_api::ParseTokenizeRequest(ex.body());
  absl::Status status = r.ok() ? CheckModel(r->model) : r.status();
  if (!status.ok()) {
    RespondError(ex, status, std::move(cors));
    return;
  }
  absl::StatusOr<std::vector<int32_t>> ids =
      r->prompt.has_value() ? core_->Tokenize(*r->prompt, r->add_special_tokens)
                            : core_->TokenizeChat(*r->messages, r->add_generation_prompt);
  if (!ids.ok()) {
    RespondError(ex, ids.status(), std::move(cors));
    return;
  }
  const int count = static_cast<int>(ids->size());
  RespondJson(ex, 200,
              {{"tokens", *std::move(ids)},
               {"count", count},
               {"max_model_len", core_->ModelInfo().max_context}},
              std::move(cors));
}

void OpenAiRoutes::Detokenize(HttpExchange& ex, std::vector<HttpHeader> cors) const {
  absl::StatusOr<openai_api::DetokenizeRequest> r = openai_api::ParseDetokenizeRequest(ex.body());
  absl::Status status = r.ok() ? CheckModel(r->model) : r.status();
  if (!status.ok()) {
    RespondError(ex, status, std::move(cors));
    return;
  }
  absl::StatusOr<std::string> text = core_->Detokenize(r->tokens);
  if (!text.ok()) {
    RespondError(ex, text.status(), std::move(cors));
    return;
  }
  RespondJson(ex, 200, {{"prompt", *std::move(text)}}, std::move(cors));
}

}  // namespace tandem::router
