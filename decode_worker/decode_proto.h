// The decode worker's side of the tandem.v1.DecodeWorker contract as plain
// functions: requests from their protos, a request's events to protos. The
// gRPC service (decode_service.h) and in-process channels (tools/sim) both
// speak through them, so the two cannot drift apart. No gRPC here.
#ifndef TANDEM_DECODE_WORKER_DECODE_PROTO_H_
#define TANDEM_DECODE_WORKER_DECODE_PROTO_H_

#include <functional>
#include <memory>
#include <span>

#include "absl/status/status.h"
#include "decode_worker/decode_loop.h"
#include "decode_worker/decode_types.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::decode {

// The request (its deadline left unset: the caller's transport has it).
Request FromProto(const v1::DecodeRequest& request);
v1::DecodeFinished ToProto(const Finished& finished);
v1::WorkerStats ToProto(const LoopStats& stats);

// An EventSink that turns a request's events into DecodeEvents for
// `write`, and its end into a status for `finish`: OK after the last
// choice's `finished`, the error when the request failed. Both are called
// on the loop's thread, in order, `finish` exactly once (unless the loop
// never ends the request), and must not block.
class ProtoEventSink final : public EventSink {
 public:
  ProtoEventSink(std::function<void(v1::DecodeEvent)> write,
                 std::function<void(const absl::Status&)> finish)
      : write_(std::move(write)), finish_(std::move(finish)) {}

  void OnReserved(const Reservation& reservation) override;
  void OnPromptLogprobs(std::span<const TokenLogprob> logprobs) override;
  void OnTokens(int index, std::span<const int32_t> ids,
                std::span<const TokenLogprob> logprobs) override;
  void OnFinished(const Finished& finished) override;
  void OnMoving(bool ships_kv) override;
  void OnFailed(const absl::Status& status) override { finish_(status); }

 private:
  const std::function<void(v1::DecodeEvent)> write_;
  const std::function<void(const absl::Status&)> finish_;
};

}  // namespace tandem::decode

#endif  // TANDEM_DECODE_WORKER_DECODE_PROTO_H_
