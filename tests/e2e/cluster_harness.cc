#include "tests/e2e/cluster_harness.h"

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/base/status_macros.h"
#include "common/model/llama2c_checkpoint.h"
#include "common/model/synthetic.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/server.h"
#include "tests/testing/model_files.h"

namespace tandem::testing {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string Tail(const std::string& text, int lines) {
  size_t at = text.size();
  for (int i = 0; i <= lines && at != std::string::npos && at > 0; ++i) {
    at = text.rfind('\n', at - 1);
  }
  return at == std::string::npos ? text : text.substr(at + 1);
}

// Waits (60 s at most) for `process` to write a port to `port_file`.
absl::StatusOr<int> WaitForPortFile(const std::string& name, const std::string& port_file,
                                    Child& process, const std::string& log) {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline) {
    const std::string text = ReadFile(port_file);
    int port = 0;
    if (!text.empty() && text.back() == '\n' &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &port)) {
      return port;
    }
    if (process.Wait(absl::ZeroDuration()) != -1) {
      return absl::InternalError(
          absl::StrCat(name, " exited during start-up:\n", Tail(ReadFile(log), 20)));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(
      absl::StrCat(name, " did not write ", port_file, " within 60 s:\n", Tail(ReadFile(log), 20)));
}

}  // namespace

absl::Status Cluster::Launch(Member& m, const std::string& listen) {
  const std::string port_file = absl::StrCat(dir_, "/", m.name, ".port");
  std::filesystem::remove(port_file);
  std::vector<std::string> args = m.prefix;
  args.insert(args.end(), m.command.begin(), m.command.end());
  args.push_back("--listen=" + listen);
  args.push_back("--port_file=" + port_file);
  m.process = std::make_unique<Child>(args, m.log);
  if (!m.process->running()) return absl::InternalError(absl::StrCat("cannot start ", args[0]));
  absl::StatusOr<int> port = WaitForPortFile(m.name, port_file, *m.process, m.log);
  if (!port.ok()) return port.status();
  m.address = absl::StrCat(m.host, ":", *port);
  m.ready_at = absl::Now();
  return absl::OkStatus();
}

absl::Status Cluster::StartMember(Member& m, const std::string& binary,
                                  std::vector<std::string> args) {
  m.log = absl::StrCat(dir_, "/", m.name, ".log");
  args.insert(args.begin(), binary);
  if (options_.placement) {
    MemberPlacement placement = options_.placement(m.name);
    args.insert(args.end(), placement.flags.begin(), placement.flags.end());
    m.prefix = std::move(placement.prefix);
    m.host = std::move(placement.host);
  }
  m.command = std::move(args);
  return Launch(m, m.host + ":0");
}

absl::Status Cluster::Restart(Member& m) {
  if (m.process != nullptr && m.process->running()) m.process->Kill();
  return Launch(m, m.address);
}

absl::StatusOr<Member*> Cluster::AddWorker(std::deque<Member>& pool, bool prefill) {
  Member& m = pool.emplace_back();
  m.name = absl::StrCat(prefill ? "prefill-" : "decode-", pool.size() - 1);
  std::vector<std::string> args = {"--model=" + options_.model, "--threads=1"};
  const std::vector<std::string>& flags = prefill ? options_.prefill_flags : options_.decode_flags;
  args.insert(args.end(), flags.begin(), flags.end());
  RETURN_IF_ERROR(StartMember(m, prefill ? TANDEM_PREFILL_BIN : TANDEM_DECODE_BIN, args));
  m.listed = options_.target_files;
  // Before the router starts, Start() writes the files once.
  if (m.listed && router_.process != nullptr) RETURN_IF_ERROR(WriteTargetFiles());
  return &m;
}

absl::StatusOr<Member*> Cluster::AddPrefillWorker() { return AddWorker(prefill_, true); }
absl::StatusOr<Member*> Cluster::AddDecodeWorker() { return AddWorker(decode_, false); }

absl::Status Cluster::WriteTargetFiles() const {
  for (const auto& [pool, name] :
       {std::pair{&prefill_, "prefill"}, std::pair{&decode_, "decode"}}) {
    std::string text = absl::StrCat("# the ", name, " pool\n");
    for (const Member& m : *pool) {
      if (m.listed) absl::StrAppend(&text, m.address, "\n");
    }
    // A new file renamed over the old: the router never reads half of one.
    const std::string path = absl::StrCat(dir_, "/", name, ".targets");
    {
      std::ofstream out(path + ".tmp", std::ios::trunc);
      out << text;
      if (!out.flush()) return absl::InternalError(absl::StrCat("cannot write ", path, ".tmp"));
    }
    std::error_code error;
    std::filesystem::rename(path + ".tmp", path, error);
    if (error) {
      return absl::InternalError(absl::StrCat("cannot replace ", path, ": ", error.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status Cluster::Unlist(Member& worker) {
  if (!options_.target_files) {
    return absl::FailedPreconditionError("Unlist needs ClusterOptions::target_files");
  }
  worker.listed = false;
  return WriteTargetFiles();
}

absl::Status Cluster::WaitForLog(const Member& m, const std::string& text,
                                 absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  while (ReadFile(m.log).find(text) == std::string::npos) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(m.name, " did not log '", text, "' within ",
                                                      absl::FormatDuration(timeout), ":\n",
                                                      Tail(ReadFile(m.log), 20)));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Cluster>> Cluster::Start(const ClusterOptions& options) {
  static std::atomic<int> serial{0};
  std::unique_ptr<Cluster> c(new Cluster());
  c->options_ = options;
  c->dir_ = absl::StrCat(TempDir(), "/cluster-", serial++);
  std::filesystem::create_directories(c->dir_);

  std::vector<std::string> prefill_addresses, decode_addresses;
  for (int i = 0; i < options.prefill; ++i) {
    ASSIGN_OR_RETURN(Member * m, c->AddPrefillWorker());
    prefill_addresses.push_back(m->address);
  }
  for (int i = 0; i < options.decode; ++i) {
    ASSIGN_OR_RETURN(Member * m, c->AddDecodeWorker());
    decode_addresses.push_back(m->address);
  }
  c->router_.name = "router";
  std::vector<std::string> args = {"--tokenizer=" + options.tokenizer};
  if (options.target_files) {
    RETURN_IF_ERROR(c->WriteTargetFiles());
    args.push_back(absl::StrCat("--prefill_workers=file:", c->dir_, "/prefill.targets"));
    args.push_back(absl::StrCat("--decode_workers=file:", c->dir_, "/decode.targets"));
  } else {
    args.push_back("--prefill_workers=" + absl::StrJoin(prefill_addresses, ","));
    args.push_back("--decode_workers=" + absl::StrJoin(decode_addresses, ","));
  }
  const std::string http_port_file = c->dir_ + "/router.http_port";
  if (options.http) {
    args.push_back("--http_listen=127.0.0.1:0");
    args.push_back("--http_port_file=" + http_port_file);
  }
  args.insert(args.end(), options.router_flags.begin(), options.router_flags.end());
  if (absl::Status s = c->StartMember(c->router_, TANDEM_ROUTER_BIN, args); !s.ok()) return s;
  if (options.http) {
    absl::StatusOr<int> port =
        WaitForPortFile("router", http_port_file, *c->router_.process, c->router_.log);
    if (!port.ok()) return port.status();
    c->http_port_ = *port;
  }
  c->router_stub_ = v1::Router::NewStub(rpc::MakeChannel(c->router_.address));
  return c;
}

Cluster::~Cluster() {
  // Router first, so that no stream is left waiting on a dead worker.
  router_.process.reset();
  prefill_.clear();
  decode_.clear();
}

absl::StatusOr<v1::WorkerStats> Cluster::Stats(const Member& worker) const {
  std::shared_ptr<grpc::Channel> channel = rpc::MakeChannel(worker.address);
  grpc::ClientContext ctx;
  ctx.set_deadline(rpc::ToChrono(absl::Now() + absl::Seconds(5)));
  v1::WorkerStats stats;
  const grpc::Status status =
      worker.name.rfind("prefill", 0) == 0
          ? v1::PrefillWorker::NewStub(channel)->GetStats(&ctx, v1::StatsRequest(), &stats)
          : v1::DecodeWorker::NewStub(channel)->GetStats(&ctx, v1::StatsRequest(), &stats);
  if (!status.ok()) return rpc::FromGrpc(status);
  return stats;
}

absl::Status Cluster::WaitUntilIdle(absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<std::string> busy;
  do {
    busy.clear();
    for (const std::deque<Member>* pool : {&prefill_, &decode_}) {
      for (const Member& m : *pool) {
        if (!m.process->running()) continue;
        absl::StatusOr<v1::WorkerStats> s = Stats(m);
        if (!s.ok()) {
          busy.push_back(absl::StrCat(m.name, ": ", s.status().ToString()));
        } else if (s->kv_blocks_free() != s->kv_blocks_total() || s->running() != 0 ||
                   s->waiting() != 0) {
          busy.push_back(absl::StrCat(m.name, ": ", s->kv_blocks_free(), " of ",
                                      s->kv_blocks_total(), " blocks free, ", s->running(),
                                      " running, ", s->waiting(), " waiting"));
        }
      }
    }
    if (busy.empty()) return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(50));
  } while (absl::Now() < deadline);
  return absl::DeadlineExceededError(absl::StrJoin(busy, "; "));
}

std::string Cluster::Logs() const {
  std::string out;
  auto add = [&](const Member& m) {
    absl::StrAppend(&out, "---- ", m.name, " (", m.log, ")\n", Tail(ReadFile(m.log), 15), "\n");
  };
  add(router_);
  for (const Member& m : prefill_) add(m);
  for (const Member& m : decode_) add(m);
  return out;
}

Completion RunGenerate(v1::Router::Stub& router, const v1::GenerateRequest& request,
                       absl::Duration timeout) {
  Completion c;
  const absl::Time start = absl::Now();
  grpc::ClientContext ctx;
  ctx.set_deadline(rpc::ToChrono(start + timeout));
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader = router.Generate(&ctx, request);
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
    ++c.messages;
    c.tokens.insert(c.tokens.end(), response.token_ids().begin(), response.token_ids().end());
    c.text += response.text();
    if (response.has_finished()) c.finished = response.finished();
  }
  c.status = reader->Finish();
  c.elapsed = absl::Now() - start;
  return c;
}

v1::GenerateRequest TextRequest(const std::string& text, int max_tokens) {
  v1::GenerateRequest r;
  r.set_text(text);
  r.set_max_tokens(max_tokens);
  return r;
}

absl::StatusOr<SyntheticModelFiles> WriteSyntheticModel(const ModelConfig& shape, uint64_t seed,
                                                        const std::string& name) {
  SyntheticModelFiles files{.model = TempDir() + "/" + name + "-model.bin",
                            .tokenizer = TempDir() + "/" + name + "-tokenizer.bin"};
  ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> weights, MakeSyntheticModel(shape, seed));
  RETURN_IF_ERROR(WriteLlama2cCheckpoint(*weights, files.model));
  ASSIGN_OR_RETURN(std::string bytes, SyntheticTokenizerBytes(shape.vocab_size));
  std::ofstream out(files.tokenizer, std::ios::binary);
  out << bytes;
  if (!out.flush()) {
    return absl::InternalError(absl::StrCat("cannot write ", files.tokenizer));
  }
  return files;
}

}  // namespace tandem::testing
