#include "common/worker/finish_reason_proto.h"

namespace tandem {

FinishReason FinishReasonFromProto(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_LENGTH:
      return FinishReason::kLength;
    case v1::FINISH_REASON_EOS:
    case v1::FINISH_REASON_TOOL_CALLS:
      return FinishReason::kEos;
    case v1::FINISH_REASON_STOP:
      return FinishReason::kStop;
    case v1::FINISH_REASON_CONTEXT:
      return FinishReason::kContext;
    default:
      return FinishReason::kUnspecified;
  }
}

v1::FinishReason FinishReasonToProto(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case FinishReason::kEos:
      return v1::FINISH_REASON_EOS;
    case FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case FinishReason::kContext:
      return v1::FINISH_REASON_CONTEXT;
    case FinishReason::kUnspecified:
      break;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

}  // namespace tandem
