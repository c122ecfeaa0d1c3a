// The OpenAI-compatible HTTP API of the router: a thin adapter that turns
// HTTP requests into tandem.v1.Router/Generate calls on a gRPC channel to
// the router's own service (in process in tandem-router) and their streams
// back into OpenAI JSON.
//
//   POST /v1/completions  non-streaming JSON, or SSE with "stream": true
//                         (one chunk per router message with text, a last
//                         chunk with finish_reason and usage, "data: [DONE]")
//   POST /v1/chat/completions
//                         the same for chat messages (chat.completion, or
//                         chat.completion.chunk deltas: the role first,
//                         then content, then finish_reason and usage);
//                         the router renders the messages with the
//                         model's chat template
//   GET  /v1/models       the one served model
//   GET  /health          200 "ok" while serving, 503 once draining
//
// Errors are OpenAI-style {"error": {message, type, code}} with the HTTP
// status of the gRPC code (openai_json.h). A streaming client that goes
// away cancels its gRPC call: a write fails, or, while no token flows, an
// SSE comment sent every `heartbeat` fails. Every call carries the deadline
// now + `request_timeout`.
//
// Thread-safe. Uses cpp-httplib; one pool thread per open HTTP connection.
#ifndef TANDEM_ROUTER_OPENAI_HTTP_H_
#define TANDEM_ROUTER_OPENAI_HTTP_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "router/openai_json.h"
#include "tandem/v1/generate.grpc.pb.h"

namespace httplib {
class Server;
struct Response;
}  // namespace httplib

namespace tandem::router {

struct OpenAiHttpOptions {
  // HOST:PORT to listen on ([v6]:PORT too); port 0 picks a free one.
  std::string listen = "127.0.0.1:0";
  // The served model name: the model id of /v1/models and of responses
  // whose request names none.
  std::string served_model_name = "tandem";
  // Deadline of every gRPC call.
  absl::Duration request_timeout = absl::Seconds(300);
  // Worker threads of the HTTP server (connections served at once).
  int threads = 64;
  // While a stream is idle, an SSE comment is written this often to notice
  // a client that went away.
  absl::Duration heartbeat = absl::Seconds(1);
  // Largest request body accepted, in bytes.
  size_t max_body_bytes = 16 << 20;
};

// INVALID_ARGUMENT unless `listen` is HOST:PORT (or [v6]:PORT), port in
// [0, 65535]; sets `host` and `port`.
absl::Status SplitHostPort(const std::string& listen, std::string* host, int* port);

class OpenAiHttpServer {
 public:
  // Binds and starts serving; UNAVAILABLE when the address cannot be bound,
  // INVALID_ARGUMENT when it is not HOST:PORT. `channel` reaches the
  // tandem.v1.Router service.
  static absl::StatusOr<std::unique_ptr<OpenAiHttpServer>> Start(
      std::shared_ptr<grpc::Channel> channel, OpenAiHttpOptions options);
  ~OpenAiHttpServer();  // Stop().

  int port() const { return port_; }
  // /health answers 503 after SetServing(false).
  void SetServing(bool serving) { serving_ = serving; }
  // Answers /health with 503, waits up to `grace` for the requests being
  // answered to end (call it after the router's gRPC drain: then only the
  // last writes remain), stops listening, cuts what is still open and joins
  // every HTTP thread. Idempotent.
  void Stop(absl::Duration grace = absl::Seconds(5));
  // Requests being answered (streams until their last write).
  int active() const;

 private:
  OpenAiHttpServer(std::shared_ptr<grpc::Channel> channel, OpenAiHttpOptions options);
  void RegisterHandlers();
  // Answers a parsed /v1/completions or /v1/chat/completions request;
  // `active` counts it until the response is over.
  void ServeCompletion(absl::StatusOr<openai::CompletionRequest> parsed,
                       std::shared_ptr<void> active, httplib::Response& res);
  // Counts a request as active until the returned token is destroyed.
  std::shared_ptr<void> BeginRequest();

  const OpenAiHttpOptions options_;
  std::unique_ptr<v1::Router::Stub> stub_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
  int64_t started_unix_ = 0;
  std::atomic<bool> serving_{true};
  std::atomic<bool> listen_returned_{false};
  mutable absl::Mutex mu_;
  int active_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_OPENAI_HTTP_H_
