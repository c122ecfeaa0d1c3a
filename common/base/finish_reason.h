// Why a generated sequence ended: the one definition the engine, the
// workers and the router share (worker.proto's FinishReason on the wire).
#ifndef TANDEM_COMMON_BASE_FINISH_REASON_H_
#define TANDEM_COMMON_BASE_FINISH_REASON_H_

namespace tandem {

enum class FinishReason {
  kUnspecified,  // not decided (yet)
  kLength,       // max_tokens reached
  kEos,          // a stop token was sampled (it is not returned)
  kStop,         // a stop string matched, or the reader stopped the sequence
  kContext,      // the model's context is full
};

// "length", "eos", "stop", "context" or "unspecified".
const char* FinishReasonName(FinishReason reason);

}  // namespace tandem

#endif  // TANDEM_COMMON_BASE_FINISH_REASON_H_
