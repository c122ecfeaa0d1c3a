// StreamWriter: the server side of a server-streaming RPC on gRPC's
// callback API, written to from any thread.
//
// gRPC allows one write in flight per stream and needs Finish exactly once;
// producers (a decode loop, a request driver) just want to push messages
// as they come. StreamWriter queues them, starts each write when the
// previous one is done, finishes after the queue drains, and stays safe to
// call after the client went away (calls then do nothing and return false).
//
//   grpc::ServerWriteReactor<Resp>* Handler(grpc::CallbackServerContext* ctx, const Req* req) {
//     auto [reactor, writer] = StreamWriter<Resp>::Create();
//     writer->OnCancel([...] { ... });     // optional
//     hand `writer` (a shared_ptr) to whoever produces the messages;
//     return reactor;
//   }
//
// Thread-safe.
#ifndef TANDEM_COMMON_RPC_STREAM_WRITER_H_
#define TANDEM_COMMON_RPC_STREAM_WRITER_H_

#include <grpcpp/grpcpp.h>

#include <deque>
#include <functional>
#include <memory>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "common/rpc/tsan_handoff.h"

namespace tandem::rpc {

template <typename Message>
class StreamWriter : public std::enable_shared_from_this<StreamWriter<Message>> {
 public:
  // The reactor to return from the handler (gRPC owns it until OnDone) and
  // the writer that feeds it.
  static std::pair<grpc::ServerWriteReactor<Message>*, std::shared_ptr<StreamWriter>> Create() {
    std::shared_ptr<StreamWriter> writer(new StreamWriter());
    auto* reactor = new Reactor(writer);
    {
      // No other thread has the writer yet; the lock is for the analysis.
      absl::MutexLock lock(&writer->mu_);
      writer->reactor_ = reactor;
    }
    HandToGrpc(reactor);  // The handler returns it to gRPC.
    return {reactor, writer};
  }

  // Queues `message`; false when the stream has ended (finished, cancelled
  // or broken), in which case it is dropped.
  bool Write(Message message) {
    absl::MutexLock lock(&mu_);
    if (ended_ || finish_requested_) return false;
    queue_.push_back(std::move(message));
    if (!writing_) StartNextLocked();
    return true;
  }

  // Ends the stream with `status` once every queued message is written.
  // Only the first call counts.
  void Finish(grpc::Status status) {
    absl::MutexLock lock(&mu_);
    if (finish_requested_) return;
    finish_requested_ = true;
    finish_status_ = std::move(status);
    if (!writing_) FinishLocked();
  }

  // Runs `fn` once if the client cancels or disconnects (at once if it
  // already has). Runs on a gRPC thread: keep it short and non-blocking.
  void OnCancel(std::function<void()> fn) {
    bool run_now = false;
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_) {
        run_now = true;
      } else {
        on_cancel_ = std::move(fn);
      }
    }
    if (run_now) fn();
  }

  bool cancelled() const {
    absl::MutexLock lock(&mu_);
    return cancelled_;
  }

 private:
  class Reactor : public grpc::ServerWriteReactor<Message> {
   public:
    explicit Reactor(std::shared_ptr<StreamWriter> writer) : writer_(std::move(writer)) {}
    void OnWriteDone(bool ok) override {
      TakeFromGrpc(this);
      writer_->WriteDone(ok);
    }
    void OnCancel() override {
      TakeFromGrpc(this);
      writer_->Cancelled();
    }
    void OnDone() override {
      TakeFromGrpc(this);
      writer_->Done();
      delete this;
    }

   private:
    std::shared_ptr<StreamWriter> writer_;  // Keeps the writer alive until OnDone.
  };

  StreamWriter() = default;

  void StartNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    writing_ = true;
    HandToGrpc(reactor_);
    reactor_->StartWrite(&queue_.front());
  }

  void FinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finish_called_ || reactor_ == nullptr) return;
    finish_called_ = true;
    ended_ = true;
    HandToGrpc(reactor_);
    reactor_->Finish(finish_status_);
  }

  void WriteDone(bool ok) {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!queue_.empty()) queue_.pop_front();
    if (!ok) {
      // The stream is broken (client gone): nothing more can be written.
      queue_.clear();
      ended_ = true;
      if (!finish_requested_) {
        finish_requested_ = true;
        finish_status_ = grpc::Status(grpc::StatusCode::CANCELLED, "stream broken");
      }
    }
    if (!queue_.empty()) {
      StartNextLocked();
    } else if (finish_requested_) {
      FinishLocked();
    }
  }

  void Cancelled() {
    std::function<void()> fn;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      ended_ = true;
      queue_.erase(queue_.begin() + (writing_ ? 1 : 0), queue_.end());
      if (!finish_requested_) {
        finish_requested_ = true;
        finish_status_ = grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
      }
      if (!writing_) FinishLocked();
      fn = std::move(on_cancel_);
      on_cancel_ = nullptr;
    }
    if (fn) fn();
  }

  void Done() {
    std::function<void()> unused;
    {
      absl::MutexLock lock(&mu_);
      ended_ = true;
      reactor_ = nullptr;
      // The call is over and can no longer be cancelled. Dropping the
      // callback breaks the cycle of a callback that holds this writer; it
      // is destroyed outside the lock (the reactor still holds the writer).
      unused = std::move(on_cancel_);
      on_cancel_ = nullptr;
    }
  }

  mutable absl::Mutex mu_;
  Reactor* reactor_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::deque<Message> queue_ ABSL_GUARDED_BY(mu_);  // front() is in flight while writing_
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_called_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status finish_status_ ABSL_GUARDED_BY(mu_);
  std::function<void()> on_cancel_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::rpc

#endif  // TANDEM_COMMON_RPC_STREAM_WRITER_H_
