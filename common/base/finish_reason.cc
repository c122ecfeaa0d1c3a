#include "common/base/finish_reason.h"

namespace tandem {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kEos:
      return "eos";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kContext:
      return "context";
    case FinishReason::kUnspecified:
      break;
  }
  return "unspecified";
}

}  // namespace tandem
