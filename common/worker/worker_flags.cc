#include "common/worker/worker_flags.h"

#include <optional>
#include <string>

#include "absl/flags/flag.h"

// One definition and one help text of each flag both workers take.
ABSL_FLAG(std::string, model, "",
          "The model (required): a Hugging Face folder (config.json and *.safetensors), a GGUF "
          "file or a llama2.c checkpoint");

ABSL_FLAG(std::string, served_model_name, "",
          "Model name reported in GetStats; the router serves only workers whose name, weights "
          "fingerprint, KV type and block size agree. Default: the name of --model's folder or "
          "file");

ABSL_FLAG(std::string, model_name, "", "Deprecated alias of --served_model_name");

ABSL_FLAG(std::string, port_file, "",
          "If set, the bound port is written here (one line) once the server is up");

ABSL_FLAG(std::string, backend, "cpu",
          "Compute backend: cpu, or cuda (needs an NVIDIA GPU and a build with TANDEM_WITH_CUDA)");

ABSL_FLAG(int, device, 0, "The GPU --backend cuda computes on (0 = the first)");

ABSL_FLAG(int, threads, 1, "Compute threads of --backend cpu; 0 = every core");

ABSL_FLAG(std::string, kv_dtype, "",
          "Element type of the KV cache: f32, bf16, f16 or int8 (8 bits with a scale per token and "
          "head); empty = the weights' type. Every "
          "prefill and decode worker of a cluster must use the same");

ABSL_FLAG(int, kv_blocks, 0,
          "KV cache blocks in the pool; 0 = room for 8 full-context sequences on the CPU, or "
          "what --gpu_memory_fraction leaves on a GPU. A request holds ceil(tokens / "
          "block_size) blocks while it is computed (and, on a prefill worker, sent)");

ABSL_FLAG(int, kv_staging_blocks, 0,
          "KV blocks of page-locked host staging that KV passes through on a GPU backend (the "
          "transport cannot reach device memory); 0: room for four longest prompts, within the "
          "pool; must be 0 on the CPU backend");

ABSL_FLAG(int, warm_up_tokens, 32,
          "Before it reports ready, the worker runs a made-up prompt of this many tokens and one "
          "decode step and frees them, so that its first request does not pay for first "
          "touches and library start-up; 0 = none");

ABSL_FLAG(std::optional<double>, gpu_memory_fraction, std::nullopt,
          "Share of the GPU's memory (0 < F <= 1) this worker takes with --backend cuda: the "
          "KV cache gets what the weights and activations leave of it (workers sharing a GPU "
          "give each its share). Default 0.9; not with --kv_blocks");

ABSL_FLAG(int, block_size, 16,
          "Tokens per KV block; every prefill and decode worker of a cluster must use the same");

ABSL_FLAG(bool, prefix_cache, true,
          "Keep computed (and, on a decode worker, received and generated) KV blocks in a "
          "prefix cache, evicted least recently used first when room is needed, so that a "
          "prompt starting with cached tokens is computed (or shipped) only from the first "
          "uncached block; --noprefix_cache computes every prompt in full");

ABSL_FLAG(std::string, kv_net_devices, "lo",
          "Network devices the KV data plane (UCX) listens on and sends over, as "
          "UCX_NET_DEVICES lists them (overrides it): e.g. eth1, mlx5_0:1, or all. The default, "
          "lo, keeps KV off the network (workers on one host also use shared memory); a "
          "multi-host cluster names its private cluster interface");

ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(30),
          "On SIGTERM/SIGINT, how long running requests may take to finish before the worker "
          "exits");
