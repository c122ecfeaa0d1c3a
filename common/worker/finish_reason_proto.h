// FinishReason (common/base/finish_reason.h) on the wire, and back; shared
// by the decode worker, which sends it, and the router, which reads it.
#ifndef TANDEM_COMMON_WORKER_FINISH_REASON_PROTO_H_
#define TANDEM_COMMON_WORKER_FINISH_REASON_PROTO_H_

#include "common/base/finish_reason.h"
#include "tandem/v1/generate.pb.h"

namespace tandem {

v1::FinishReason FinishReasonToProto(FinishReason reason);
// An unknown value reads as kUnspecified.
FinishReason FinishReasonFromProto(v1::FinishReason reason);

}  // namespace tandem

#endif  // TANDEM_COMMON_WORKER_FINISH_REASON_PROTO_H_
