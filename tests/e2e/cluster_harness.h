// A real tandem cluster for end-to-end tests: tandem-router, tandem-prefill
// and tandem-decode processes on loopback (gRPC on ports the processes pick,
// KV over UCX), logs in a temporary folder, every process killed when the
// cluster object goes away.
#ifndef TANDEM_TESTS_E2E_CLUSTER_HARNESS_H_
#define TANDEM_TESTS_E2E_CLUSTER_HARNESS_H_

#include <grpcpp/grpcpp.h>

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/model/model_config.h"
#include "tandem/v1/generate.grpc.pb.h"
#include "tandem/v1/worker.grpc.pb.h"
#include "tests/testing/child_process.h"

namespace tandem::testing {

// Where one member runs: the command its binary is run under (e.g. `ip
// netns exec NS`), flags added to its own, and the host it listens on.
struct MemberPlacement {
  std::vector<std::string> prefix = {};
  std::vector<std::string> flags = {};
  std::string host = "127.0.0.1";
};

struct ClusterOptions {
  int prefill = 2;
  int decode = 2;
  std::string model = "";
  std::string tokenizer = "";
  // Extra flags for each kind of process.
  std::vector<std::string> router_flags = {};
  std::vector<std::string> prefill_flags = {};
  std::vector<std::string> decode_flags = {};
  // Serve the router's HTTP API too, on a port it picks (Cluster::http_port).
  bool http = false;
  // Give the router its workers as file: targets (one file per pool, in
  // Cluster::dir()), so that workers can join (AddPrefillWorker,
  // AddDecodeWorker) and leave (Unlist) while it runs.
  bool target_files = false;
  // Where each member runs, by its name (router, prefill-0, decode-1, ...);
  // unset, every member runs here on 127.0.0.1.
  std::function<MemberPlacement(const std::string& name)> placement = nullptr;
};

// One worker or router process and its gRPC address.
struct Member {
  std::string name;
  std::string log;
  std::unique_ptr<Child> process;
  std::string address;  // host:port (127.0.0.1 unless placed elsewhere)
  // The binary and its flags, but for --listen and --port_file.
  std::vector<std::string> command;
  // Run before the command (ClusterOptions::placement), and the host it listens on.
  std::vector<std::string> prefix;
  std::string host = "127.0.0.1";
  // When its port file appeared: it serves from then on.
  absl::Time ready_at;
  // With ClusterOptions::target_files: its address is in its pool's file.
  bool listed = false;
};

class Cluster {
 public:
  // Starts the workers, waits for their ports, then the router (bounded).
  static absl::StatusOr<std::unique_ptr<Cluster>> Start(const ClusterOptions& options);
  ~Cluster();

  v1::Router::Stub& router() { return *router_stub_; }
  Member& router_member() { return router_; }
  Member& prefill(int i) { return prefill_[i]; }
  Member& decode(int i) { return decode_[i]; }
  int num_prefill() const { return static_cast<int>(prefill_.size()); }
  int num_decode() const { return static_cast<int>(decode_.size()); }

  // The router's HTTP port (with ClusterOptions::http), else 0.
  int http_port() const { return http_port_; }
  // The folder of the logs and port files.
  const std::string& dir() const { return dir_; }

  absl::StatusOr<v1::WorkerStats> Stats(const Member& worker) const;

  // Starts a member that has stopped (or kills it first) again with the same
  // flags on the same address; waits (bounded) for its port.
  absl::Status Restart(Member& m);

  // One more worker of the pool, with the pool's flags, started and waited
  // for (bounded) like the first ones and, with target_files, listed in
  // the pool's file at once. The member stays where it is (prefill(i),
  // decode(i) with the next i) for the cluster's life.
  absl::StatusOr<Member*> AddPrefillWorker();
  absl::StatusOr<Member*> AddDecodeWorker();
  // With target_files: takes the worker out of its pool's file (replaced
  // atomically); the process keeps running.
  absl::Status Unlist(Member& worker);

  // Waits (bounded) until the member's log holds `text`.
  absl::Status WaitForLog(const Member& m, const std::string& text, absl::Duration timeout) const;

  // Waits until every worker that is still running reports all its KV
  // blocks free and nothing running or waiting; the error lists those that
  // do not.
  absl::Status WaitUntilIdle(absl::Duration timeout) const;

  // The last lines of every log, for failure messages.
  std::string Logs() const;

 private:
  Cluster() = default;
  absl::Status StartMember(Member& m, const std::string& binary, std::vector<std::string> args);
  // Runs m.command listening on `listen`, and waits for its port file.
  absl::Status Launch(Member& m, const std::string& listen);
  absl::StatusOr<Member*> AddWorker(std::deque<Member>& pool, bool prefill);
  // Writes both pools' target files with their listed members.
  absl::Status WriteTargetFiles() const;

  ClusterOptions options_;
  std::string dir_;
  Member router_;
  // Deques: members added later leave the earlier ones where they are.
  std::deque<Member> prefill_;
  std::deque<Member> decode_;
  std::unique_ptr<v1::Router::Stub> router_stub_;
  int http_port_ = 0;
};

// What one Generate stream returned.
struct Completion {
  grpc::Status status;
  std::vector<int32_t> tokens;
  std::string text;
  v1::Finished finished;
  int messages = 0;
  absl::Duration elapsed;
};

// Runs one Generate call to the end (or `timeout`).
Completion RunGenerate(v1::Router::Stub& router, const v1::GenerateRequest& request,
                       absl::Duration timeout = absl::Seconds(60));

v1::GenerateRequest TextRequest(const std::string& text, int max_tokens);

// A llama2.c checkpoint of random weights of `shape` and its byte-level
// tokenizer, written as TempDir()/NAME-model.bin and NAME-tokenizer.bin.
struct SyntheticModelFiles {
  std::string model;
  std::string tokenizer;
};
absl::StatusOr<SyntheticModelFiles> WriteSyntheticModel(const ModelConfig& shape, uint64_t seed,
                                                        const std::string& name);

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_E2E_CLUSTER_HARNESS_H_
