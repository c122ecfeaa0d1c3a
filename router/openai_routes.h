// The OpenAI-compatible HTTP API over a RequestCore: the HttpServer's
// handler.
//
//   POST /v1/completions, /v1/chat/completions   JSON, or SSE when "stream"
//   GET  /v1/models, /v1/models/{id}             the served model (404 else)
//   POST /tokenize, /detokenize                   vLLM's shapes
//   GET  /version                                 {"version": ...}
//   GET  /health                                  200 while core->Serving(),
//                                                 else 503; needs no key
//   OPTIONS *                                     CORS preflight
// HEAD is served wherever GET is, with the same header and no body.
//
// Every response carries X-Request-Id: the client's own (1 to 128 of
// [A-Za-z0-9._:-]; another value is a 400), else the completion's id for a
// generation and a fresh "req-..." id for the rest. A generation's id is
// the request_id of its log line (requests.jsonl) and of its worker calls.
//
// With API keys configured every route but /health (and preflights) needs
// "Authorization: Bearer <key>" (401 otherwise). Errors are OpenAI-style
// {"error": {message, type, param, code}} with the status of
// openai_api::ErrorFor. A streamed response's headers wait for the request's
// first event, so a refusal still gets its own status; once streaming, a
// failure is an SSE error event before [DONE].
//
// A client that goes away (closes the connection, or stops reading)
// cancels its request at once, streamed or not.
//
// Thread-safe; never blocks an io thread: /tokenize and /detokenize, and
// the parsing of a request body over inline_body_bytes, run on the
// executor (the router core's), and requests go to RequestCore::Submit.
#ifndef TANDEM_ROUTER_OPENAI_ROUTES_H_
#define TANDEM_ROUTER_OPENAI_ROUTES_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/base/executor.h"
#include "common/http/http_server.h"
#include "router/api_keys.h"
#include "router/request_core.h"

namespace tandem::router {

// The shared HTTP server's types, as the router's API uses them.
using http::HttpExchange;
using http::HttpHandler;
using http::HttpHeader;
using http::HttpServer;
using http::HttpServerOptions;

struct OpenAiRoutesOptions {
  // CORS: the origins a browser may call from ("*" = any). Empty = no CORS
  // headers at all.
  std::vector<std::string> allowed_origins;
  // What GET /version answers.
  std::string version = "unknown";
  // GenerateParams::timeout of every request (zero = the core's default).
  absl::Duration request_timeout = absl::ZeroDuration();
  // Where work too long for an io thread runs; it must outlive the
  // requests. Null: on the io thread (tests).
  Executor* executor = nullptr;
  // Bodies up to this size are parsed on the io thread; larger ones on
  // `large_executor` when set (the core's lane of large preparations, so
  // that megabytes of JSON never delay small requests), else on `executor`.
  size_t inline_body_bytes = 64 << 10;
  Executor* large_executor = nullptr;
};

class OpenAiRoutes {
 public:
  // `core` must outlive this object and every request it submitted.
  OpenAiRoutes(RequestCore* core, ApiKeys keys, OpenAiRoutesOptions options);

  void Handle(std::shared_ptr<HttpExchange> exchange) const;
  // Handle, as the HttpServer takes it (this object must outlive the server).
  HttpHandler Handler() const;

 private:
  // CORS headers for the request's Origin, when it is allowed.
  std::vector<HttpHeader> CorsHeaders(const HttpExchange& ex) const;
  void Preflight(HttpExchange& ex, std::vector<HttpHeader> cors) const;
  // A generation's ids: the response's "id" and the X-Request-Id.
  struct Ids {
    std::string completion = {};
    std::string request = {};
  };
  void Generate(std::shared_ptr<HttpExchange> ex, bool chat, Ids ids,
                std::vector<HttpHeader> cors) const;
  void Tokenize(HttpExchange& ex, std::vector<HttpHeader> cors) const;
  void Detokenize(HttpExchange& ex, std::vector<HttpHeader> cors) const;
  // Parses the body and submits the request.
  void ParseAndSubmit(std::shared_ptr<HttpExchange> ex, bool chat, Ids ids,
                      std::vector<HttpHeader> cors) const;
  void Models(HttpExchange& ex, absl::string_view id, std::vector<HttpHeader> cors) const;
  // Runs `work` on the executor (the large one for a body above
  // inline_body_bytes, when there is one), or here without one.
  void Offload(std::function<void()> work, size_t body_bytes = 0) const;
  // NOT_FOUND unless `model` is "" or the served model.
  absl::Status CheckModel(const std::string& model) const;

  RequestCore* const core_;
  const ApiKeys keys_;
  const OpenAiRoutesOptions options_;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_OPENAI_ROUTES_H_
