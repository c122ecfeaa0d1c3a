#include "router/openai_http.h"

#include <httplib.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cstdint>
#include <deque>
#include <exception>
#include <random>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/base/logging.h"
#include "common/rpc/grpc_status.h"
#include "router/openai_json.h"

namespace tandem::router {
namespace {

using nlohmann::json;

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void WriteError(httplib::Response& res, const absl::Status& status) {
  const openai::HttpError e = openai::ErrorFor(status);
  res.status = e.http_status;
  if (e.http_status == 429) res.set_header("Retry-After", "1");
  res.set_content(Dump(e.body), "application/json");
}

std::string NewCompletionId(bool chat) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return absl::StrFormat("%s-%016x%08x", chat ? "chatcmpl" : "cmpl", rng(),
                         static_cast<uint32_t>(rng()));
}

// One Generate call; a thread of its own reads the stream into a queue so
// that the HTTP thread can wait for the next message with a timeout.
class Call {
 public:
  enum class Event { kMessage, kEnd, kIdle };

  Call(v1::Router::Stub* stub, v1::GenerateRequest request, absl::Time deadline)
      : request_(std::move(request)) {
    ctx_.set_deadline(rpc::ToChrono(deadline));
    thread_ = std::thread([this, stub] { Pump(stub); });
  }
  ~Call() {
    ctx_.TryCancel();
    thread_.join();
  }
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

  void Cancel() { ctx_.TryCancel(); }

  // The next message into `out`, kEnd once the stream is over (status()
  // then says how), or kIdle when `timeout` passed without either.
  Event Next(absl::Duration timeout, v1::GenerateResponse* out) {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue_.empty() || ended_; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) return Event::kIdle;
    if (queue_.empty()) return Event::kEnd;
    *out = std::move(queue_.front());
    queue_.pop_front();
    return Event::kMessage;
  }

  // Waits until a message is queued or the stream is over; true when the
  // stream ended before any message.
  bool EndedEmpty() {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue_.empty() || ended_; };
    mu_.Await(absl::Condition(&ready));
    return queue_.empty();
  }

  grpc::Status status() {
    absl::MutexLock lock(&mu_);
    return status_;
  }

 private:
  void Pump(v1::Router::Stub* stub) {
    std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
        stub->Generate(&ctx_, request_);
    v1::GenerateResponse m;
    while (reader->Read(&m)) {
      absl::MutexLock lock(&mu_);
      queue_.push_back(std::move(m));
      m.Clear();
    }
    grpc::Status status = reader->Finish();
    absl::MutexLock lock(&mu_);
    status_ = std::move(status);
    ended_ = true;
  }

  const v1::GenerateRequest request_;
  grpc::ClientContext ctx_;
  absl::Mutex mu_;
  std::deque<v1::GenerateResponse> queue_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// What a streaming response's content provider keeps between calls.
struct StreamState {
  // Keeps the request counted as active until the response is over (and,
  // declared first, until the call below is cancelled and joined).
  std::shared_ptr<void> active;
  std::unique_ptr<Call> call;
  openai::CompletionMeta meta;
  bool finished = false;
  // Written before the first message (the role chunk of a chat stream).
  std::string preamble;
};

// Writes `data`; on failure (the client went away) cancels the call.
bool WriteOrCancel(StreamState& state, httplib::DataSink& sink, const std::string& data) {
  if (data.empty() || sink.write(data.data(), data.size())) return true;
  state.call->Cancel();
  return false;
}

// One step of an SSE stream: at most one router message, a heartbeat, or
// the end. False stops the response (and the call).
bool StreamStep(StreamState& state, httplib::DataSink& sink, absl::Duration heartbeat) {
  v1::GenerateResponse m;
  switch (state.call->Next(heartbeat, &m)) {
    case Call::Event::kIdle:
      return WriteOrCancel(state, sink, ": keep-alive\n\n");
    case Call::Event::kMessage: {
      std::string out = std::move(state.preamble);
      state.preamble.clear();
      if (!m.text().empty()) {
        out += openai::SseEvent(Dump(openai::CompletionChunk(state.meta, m.text())));
      }
      if (m.has_finished()) {
        out += openai::SseEvent(Dump(openai::FinalChunk(state.meta, m.finished())));
        state.finished = true;
      }
      return WriteOrCancel(state, sink, out);
    }
    case Call::Event::kEnd: {
      const grpc::Status status = state.call->status();
      std::string out;
      if (!status.ok()) {
        out += openai::SseEvent(Dump(openai::ErrorFor(rpc::FromGrpc(status)).body));
      } else if (!state.finished) {
        out += openai::SseEvent(Dump(
            openai::ErrorFor(absl::InternalError("the router ended the stream without a finish"))
                .body));
      }
      out += openai::SseEvent("[DONE]");
      if (!WriteOrCancel(state, sink, out)) return false;
      sink.done();
      return true;
    }
  }
  return false;
}

int64_t UnixNow() { return absl::ToUnixSeconds(absl::Now()); }

}  // namespace

absl::Status SplitHostPort(const std::string& listen, std::string* host, int* port) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(listen.substr(colon + 1), port) || *port < 0 || *port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http_listen=", listen, " is not HOST:PORT (port 0 picks a free one)"));
  }
  *host = listen.substr(0, colon);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  return absl::OkStatus();
}

OpenAiHttpServer::OpenAiHttpServer(std::shared_ptr<grpc::Channel> channel,
                                   OpenAiHttpOptions options)
    : options_(std::move(options)),
      stub_(v1::Router::NewStub(std::move(channel))),
      server_(std::make_unique<httplib::Server>()),
      started_unix_(UnixNow()) {}

OpenAiHttpServer::~OpenAiHttpServer() { Stop(); }

absl::StatusOr<std::unique_ptr<OpenAiHttpServer>> OpenAiHttpServer::Start(
    std::shared_ptr<grpc::Channel> channel, OpenAiHttpOptions options) {
  std::string host;
  int port = 0;
  if (absl::Status s = SplitHostPort(options.listen, &host, &port); !s.ok()) return s;
  if (options.threads < 1) return absl::InvalidArgumentError("--http_threads must be >= 1");
  std::unique_ptr<OpenAiHttpServer> self(
      new OpenAiHttpServer(std::move(channel), std::move(options)));
  self->RegisterHandlers();
  httplib::Server& server = *self->server_;
  if (port == 0) {
    port = server.bind_to_any_port(host);
    if (port < 0) port = 0;
  } else if (!server.bind_to_port(host, port)) {
    port = 0;
  }
  if (port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen for HTTP on ", self->options_.listen));
  }
  self->port_ = port;
  // The socket listens already: connections wait in its backlog until the
  // accept loop runs.
  OpenAiHttpServer* raw = self.get();
  self->thread_ = std::thread([raw] {
    raw->server_->listen_after_bind();
    raw->listen_returned_ = true;
  });
  return self;
}

void OpenAiHttpServer::Stop(absl::Duration grace) {
  if (!thread_.joinable()) return;
  serving_ = false;
  {
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return active_ == 0; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&idle), grace)) {
      LOG(WARNING) << active_ << " HTTP responses still open after " << grace << "; cutting them";
    }
  }
  // stop() is a no-op until the accept loop runs: wait for it to start (or
  // to have given up).
  while (!server_->is_running() && !listen_returned_) absl::SleepFor(absl::Milliseconds(1));
  server_->stop();
  thread_.join();
}

int OpenAiHttpServer::active() const {
  absl::MutexLock lock(&mu_);
  return active_;
}

std::shared_ptr<void> OpenAiHttpServer::BeginRequest() {
  {
    absl::MutexLock lock(&mu_);
    ++active_;
  }
  return std::shared_ptr<void>(nullptr, [this](void*) {
    absl::MutexLock lock(&mu_);
    --active_;
  });
}

void OpenAiHttpServer::ServeCompletion(absl::StatusOr<openai::CompletionRequest> parsed,
                                       std::shared_ptr<void> active, httplib::Response& res) {
  if (!parsed.ok()) {
    WriteError(res, parsed.status());
    return;
  }
  openai::CompletionMeta meta{
      .id = NewCompletionId(parsed->chat),
      .created = UnixNow(),
      .model = parsed->model.empty() ? options_.served_model_name : parsed->model,
      .chat = parsed->chat};
  parsed->request.set_request_id(meta.id);
  auto call = std::make_unique<Call>(stub_.get(), std::move(parsed->request),
                                     absl::Now() + options_.request_timeout);
  if (call->EndedEmpty()) {
    const grpc::Status status = call->status();
    WriteError(res, status.ok() ? absl::InternalError("the router sent no response")
                                : rpc::FromGrpc(status));
    return;
  }
  if (!parsed->stream) {
    std::string text;
    v1::Finished finished;
    v1::GenerateResponse m;
    while (call->Next(absl::InfiniteDuration(), &m) == Call::Event::kMessage) {
      text += m.text();
      if (m.has_finished()) finished = m.finished();
    }
    const grpc::Status status = call->status();
    if (!status.ok()) {
      WriteError(res, rpc::FromGrpc(status));
      return;
    }
    res.set_content(Dump(openai::CompletionResponse(meta, text, finished)), "application/json");
    return;
  }
  auto state = std::make_shared<StreamState>();
  state->call = std::move(call);
  if (meta.chat) state->preamble = openai::SseEvent(Dump(openai::RoleChunk(meta)));
  state->meta = std::move(meta);
  state->active = std::move(active);
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  const absl::Duration heartbeat = options_.heartbeat;
  res.set_chunked_content_provider(
      "text/event-stream",
      [state, heartbeat](size_t /*offset*/, httplib::DataSink& sink) {
        return StreamStep(*state, sink, heartbeat);
      },
      [state](bool success) {
        if (!success) state->call->Cancel();
      });
}

void OpenAiHttpServer::RegisterHandlers() {
  httplib::Server& server = *server_;
  const size_t threads = static_cast<size_t>(options_.threads);
  server.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  server.set_payload_max_length(options_.max_body_bytes);
  // httplib's default sets SO_REUSEPORT, which lets a second server bind a
  // port in use; SO_REUSEADDR only. TCP_NODELAY (inherited by accepted
  // sockets) so that small SSE chunks leave at once.
  server.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof(yes));
  });

  server.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    std::shared_ptr<void> active = BeginRequest();
    ServeCompletion(openai::ParseCompletionRequest(req.body), std::move(active), res);
  });
  // Chat runs as a completion whose prompt is the messages: the router
  // renders them with the model's chat template and tokenizes the result.
  server.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    std::shared_ptr<void> active = BeginRequest();
    ServeCompletion(openai::ParseChatCompletionRequest(req.body), std::move(active), res);
  });

  server.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    const json body = {{"object", "list"},
                       {"data", json::array({{{"id", options_.served_model_name},
                                              {"object", "model"},
                                              {"created", started_unix_},
                                              {"owned_by", "tandem"}}})}};
    res.set_content(Dump(body), "application/json");
  });

  server.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (serving_) {
      res.set_content("ok", "text/plain");
    } else {
      res.status = 503;
      res.set_content("draining", "text/plain");
    }
  });

  server.set_error_handler(
      httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        absl::Status status = absl::UnknownError(absl::StrCat("HTTP ", res.status));
        if (res.status == 404) {
          status = absl::NotFoundError(absl::StrCat(
              "no route ", req.method, " ", req.path,
              "; served: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET "
              "/health"));
        } else if (res.status == 413) {
          status = absl::InvalidArgumentError("the request body is too large");
        } else if (res.status < 500) {
          status = absl::InvalidArgumentError(absl::StrCat("bad HTTP request (", res.status, ")"));
        }
        const int http_status = res.status;
        const openai::HttpError e = openai::ErrorFor(status);
        res.status = http_status;
        res.set_content(Dump(e.body), "application/json");
        return httplib::Server::HandlerResponse::Handled;
      }));

  server.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown exception";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        LOG(ERROR) << "HTTP handler failed: " << what;
        WriteError(res, absl::InternalError(absl::StrCat("internal error: ", what)));
      });
}

}  // namespace tandem::router
