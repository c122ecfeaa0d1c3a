// WorkerStatsRecord to and from worker.proto's WorkerStats.
#ifndef TANDEM_COMMON_WORKER_WORKER_STATS_PROTO_H_
#define TANDEM_COMMON_WORKER_WORKER_STATS_PROTO_H_

#include "common/worker/worker_stats.h"
#include "tandem/v1/worker.pb.h"

namespace tandem {

// WorkerStats of a worker of `role` ("prefill" or "decode"), and back.
void WorkerStatsToProto(const WorkerStatsRecord& stats, const char* role, v1::WorkerStats* proto);
WorkerStatsRecord WorkerStatsFromProto(const v1::WorkerStats& proto);

}  // namespace tandem

#endif  // TANDEM_COMMON_WORKER_WORKER_STATS_PROTO_H_
