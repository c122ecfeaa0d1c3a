// The flags both workers (tandem-prefill, tandem-decode) take, defined
// once with one help text each; each main reads them with absl::GetFlag.
// Flags whose meaning differs by role (--listen, --max_batch_tokens) stay
// in the mains.
#ifndef TANDEM_COMMON_WORKER_WORKER_FLAGS_H_
#define TANDEM_COMMON_WORKER_WORKER_FLAGS_H_

#include <optional>
#include <string>

#include "absl/flags/declare.h"
#include "absl/time/time.h"

ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, served_model_name);
ABSL_DECLARE_FLAG(std::string, model_name);
ABSL_DECLARE_FLAG(std::string, port_file);
ABSL_DECLARE_FLAG(std::string, backend);
ABSL_DECLARE_FLAG(int, device);
ABSL_DECLARE_FLAG(int, threads);
ABSL_DECLARE_FLAG(std::string, kv_dtype);
ABSL_DECLARE_FLAG(int, kv_blocks);
ABSL_DECLARE_FLAG(int, kv_staging_blocks);
ABSL_DECLARE_FLAG(int, warm_up_tokens);
ABSL_DECLARE_FLAG(std::optional<double>, gpu_memory_fraction);
ABSL_DECLARE_FLAG(int, block_size);
ABSL_DECLARE_FLAG(bool, prefix_cache);
ABSL_DECLARE_FLAG(std::string, kv_net_devices);
ABSL_DECLARE_FLAG(absl::Duration, drain_timeout);

#endif  // TANDEM_COMMON_WORKER_WORKER_FLAGS_H_
