// tandem-kvbench: KV-cache transfer bandwidth and latency of UcxTransport
// between two processes on this host, beside ucx_perftest's tag_bw at the
// same message sizes and the same UCX_TLS (see ../shared/docs/PERF_ANCHORS.md).
//
// A transfer is shaped like one request's KV: `--layers` messages of one
// size, posted layer by layer and striped round-robin over `--lanes`
// connections; the receiver places each layer into its own slot and answers
// once every layer has landed. Latency is from the first post to that
// answer. Run it once per UCX_TLS setting:
//   tandem-kvbench
//   UCX_TLS=tcp tandem-kvbench
// --receiver_prefix starts the receiver behind another network namespace's
// interface, as scripts/bench-lanes.sh does to measure a long, capped path.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/flags/flag.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/base/executor.h"
#include "common/base/flags.h"
#include "common/base/logging.h"
#include "common/base/xxhash_dispatch.h"
#include "kvtransfer/chunk_verifier.h"
#include "kvtransfer/transfer_receiver.h"
#include "kvtransfer/ucx/ucx_transport.h"

ABSL_FLAG(std::vector<std::string>, sizes, std::vector<std::string>({"64KiB", "1MiB"}),
          "Message (one layer's KV) sizes: bytes, or with a KiB / MiB suffix");
ABSL_FLAG(int, layers, 32, "Messages per transfer, one per layer (8 to 64 for real models)");
ABSL_FLAG(int, transfers, 30, "Timed transfers per configuration");
ABSL_FLAG(int, warmup, 3, "Untimed transfers before the timed ones");
ABSL_FLAG(int, in_flight, 2,
          "Transfers posted before the oldest is answered (requests a prefill worker streams "
          "at once)");
ABSL_FLAG(std::vector<std::string>, lanes, std::vector<std::string>({"1", "4"}),
          "Connections to stripe each transfer over, one configuration per value");
ABSL_FLAG(int, slices, 1,
          "Slices each message is gathered from and scattered into (KV blocks of a layer)");
ABSL_FLAG(int, repeats, 3,
          "Runs of every configuration, interleaved with ucx_perftest; medians are reported "
          "(the machines this runs on are noisy)");
ABSL_FLAG(bool, detect_peer_failure, true,
          "UcxTransportOptions::detect_peer_failure: UCX peer-failure handling, which UCX 1.13 "
          "has only on TCP, so on one host it turns the shared-memory path off");
ABSL_FLAG(int, max_sends_in_flight, tandem::kvtransfer::UcxTransportOptions{}.max_sends_in_flight,
          "UcxTransportOptions::max_sends_in_flight: sends to one peer handed to UCX at once");
ABSL_FLAG(bool, huge_pages, true,
          "Back the source and destination buffers with transparent huge pages (madvise)");
ABSL_FLAG(bool, perftest, true,
          "Also run ucx_perftest -t tag_bw, with (-e) and without endpoint error handling, when "
          "it is installed");
ABSL_FLAG(int, perftest_port, 13377, "TCP port for ucx_perftest's rendezvous");
ABSL_FLAG(std::string, receiver_prefix, "",
          "Words the receiver process is started under, split on spaces, e.g. 'ip netns exec NS "
          "env UCX_NET_DEVICES=DEV' to put it behind another network namespace's interface");
ABSL_FLAG(std::vector<std::string>, checksums, std::vector<std::string>({"off", "on"}),
          "Configurations without (off) and with (on) a checksum per layer, interleaved in every "
          "repeat. With: as the transfer protocol does (decode workers' --kv_checksums), the "
          "sender hashes each layer (XXH3-64) once, where it is written (prefill workers hash on "
          "their compute thread as each layer is computed; here once per run, timed apart), "
          "and the receiver hashes what landed and compares before it counts the layer");
ABSL_FLAG(std::string, role, "", "Internal: 'receiver' runs the receiving process");
ABSL_FLAG(int, ready_fd, -1, "Internal: where the receiver writes its address");
ABSL_FLAG(std::string, size, "", "Internal: the receiver's message size");
ABSL_FLAG(int, verify_threads, 1,
          "Threads that verify checksums in the receiver, as a decode worker's "
          "--kv_verify_threads; 0 = inline on the thread that polls");
ABSL_FLAG(bool, sender_waits, true,
          "The sender sleeps on the transport while it has nothing to post, as a prefill "
          "worker's loop does; false = it polls without pause");
ABSL_FLAG(bool, verify, false, "Internal: the receiver verifies each layer's checksum");

namespace tandem::kvtransfer {
namespace {

using Kind = TransportEvent::Kind;

// The longest any one configuration may take; nothing here waits longer.
constexpr absl::Duration kConfigTimeout = absl::Seconds(120);

uint64_t ParseSize(const std::string& text) {
  uint64_t scale = 1;
  std::string digits = text;
  for (const auto& [suffix, factor] :
       {std::pair<std::string, uint64_t>{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}}) {
    if (digits.size() > suffix.size() && digits.ends_with(suffix)) {
      digits.resize(digits.size() - suffix.size());
      scale = factor;
    }
  }
  uint64_t value = 0;
  CHECK(absl::SimpleAtoi(digits, &value) && value > 0) << "bad size '" << text << "'";
  return value * scale;
}

// `parts` slices covering [offset, offset + length) of `region`.
std::vector<Slice> Slices(RegionId region, uint64_t offset, uint64_t length, int parts) {
  std::vector<Slice> slices;
  const uint64_t step = length / parts;
  for (int i = 0; i < parts; ++i) {
    const uint64_t begin = i * step;
    const uint64_t end = i + 1 == parts ? length : begin + step;
    slices.push_back({region, offset + begin, end - begin});
  }
  return slices;
}

// `bytes` of zeroed memory; with --huge_pages, advised into transparent
// huge pages (fewer pages for the kernel to pin and walk per copy).
std::shared_ptr<char> AllocateBuffer(size_t bytes) {
  if (!absl::GetFlag(FLAGS_huge_pages)) {
    return std::shared_ptr<char>(new char[bytes](), std::default_delete<char[]>());
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(p != MAP_FAILED);
  madvise(p, bytes, MADV_HUGEPAGE);
  memset(p, 0, bytes);
  return std::shared_ptr<char>(static_cast<char*>(p), [bytes](char* q) { munmap(q, bytes); });
}

UcxTransportOptions TransportOptions() {
  UcxTransportOptions options;
  options.detect_peer_failure = absl::GetFlag(FLAGS_detect_peer_failure);
  options.max_sends_in_flight = absl::GetFlag(FLAGS_max_sends_in_flight);
  return options;
}

// Receives transfers until told to stop or the parent goes away.
int RunReceiver() {
  const uint64_t size = ParseSize(absl::GetFlag(FLAGS_size));
  const int layers = absl::GetFlag(FLAGS_layers);
  const int parts = absl::GetFlag(FLAGS_slices);
  absl::StatusOr<std::unique_ptr<UcxTransport>> transport =
      UcxTransport::Create(TransportOptions());
  CHECK_OK(transport.status());
  std::shared_ptr<char> slots = AllocateBuffer(size * layers);
  absl::StatusOr<RegionId> region =
      (*transport)->RegisterMemory(slots.get(), size * layers, MemoryKind::kHost);
  CHECK_OK(region.status());
  const std::string line = absl::BytesToHexString((*transport)->LocalAddress()) + "\n";
  CHECK(write(absl::GetFlag(FLAGS_ready_fd), line.data(), line.size()) ==
        static_cast<ssize_t>(line.size()));
  close(absl::GetFlag(FLAGS_ready_fd));

  std::vector<TransportEvent> events;
  absl::flat_hash_map<uint64_t, int> landed;  // transfer -> layers placed
  struct Placing {
    uint64_t transfer = 0;
    PeerId peer{};
    int layer = 0;
    uint64_t checksum = 0;
  };
  absl::flat_hash_map<IncomingId, Placing> placing;
  const bool checksums = absl::GetFlag(FLAGS_verify);
  // The decode worker's ChunkVerifier, on threads of its own as there.
  std::unique_ptr<ThreadPoolExecutor> verify_pool;
  if (absl::GetFlag(FLAGS_verify_threads) > 0) {
    verify_pool = std::make_unique<ThreadPoolExecutor>(absl::GetFlag(FLAGS_verify_threads));
  }
  ChunkVerifier verifier(verify_pool.get(), ReceiverOptions{}.verify_offload_bytes);
  std::vector<ChunkVerifier::Verdict> verdicts;
  absl::flat_hash_map<uint64_t, Placing> checking;  // By verifier tag.
  uint64_t next_check = 1;
  auto land = [&](const Placing& p) {
    if (++landed[p.transfer] == layers) {
      landed.erase(p.transfer);
      CHECK_OK((*transport)->PostSend(p.peer, absl::StrCat(p.transfer), {}).status());
    }
  };
  const absl::Time give_up = absl::Now() + kConfigTimeout;
  for (uint64_t round = 0; absl::Now() < give_up; ++round) {
    if (round % 4096 == 0 && getppid() == 1) return 1;
    verdicts.clear();
    verifier.Collect(verdicts);
    for (const ChunkVerifier::Verdict& v : verdicts) {
      const Placing p = checking[v.tag];
      checking.erase(v.tag);
      CHECK(v.ok) << "layer " << p.layer << " of transfer " << p.transfer << " arrived corrupted";
      land(p);
    }
    events.clear();
    (*transport)->Poll(events);
    for (const TransportEvent& event : events) {
      if (event.kind == Kind::kIncoming) {
        if (event.header == "bye") return 0;
        std::vector<std::string> fields = absl::StrSplit(event.header, ' ');
        Placing p{.peer = event.peer};
        CHECK(fields.size() == (checksums ? 3u : 2u) && absl::SimpleAtoi(fields[0], &p.transfer) &&
              absl::SimpleAtoi(fields[1], &p.layer) && p.layer < layers &&
              event.payload_bytes == size &&
              (!checksums || absl::SimpleAtoi(fields[2], &p.checksum)))
            << "unexpected message '" << event.header << "'";
        CHECK_OK((*transport)->Accept(event.id, Slices(*region, p.layer * size, size, parts)));
        placing[event.id] = p;
      } else if (event.kind == Kind::kReceiveDone) {
        CHECK_OK(event.status);
        const Placing p = placing[event.id];
        placing.erase(event.id);
        if (checksums) {
          const std::span<const std::byte> bytes(
              reinterpret_cast<const std::byte*>(slots.get()) + p.layer * size, size);
          checking[next_check] = p;
          verifier.Submit(next_check++, {bytes}, p.checksum);
        } else {
          land(p);
        }
      } else if (event.kind == Kind::kPeerFailed) {
        return 1;
      }
    }
  }
  return 1;
}

struct Result {
  uint64_t size;
  int lanes;
  bool checksums;
  double gbps;
  double p50_us;
  double p99_us;
};

// This binary's path; /proc/self/exe would name the prefix's program
// (e.g. ip) once a --receiver_prefix runs first.
std::string SelfPath() {
  std::string path(4096, '\0');
  const ssize_t n = readlink("/proc/self/exe", path.data(), path.size());
  CHECK(n > 0 && n < static_cast<ssize_t>(path.size()));
  path.resize(n);
  return path;
}

// Starts a receiver for `size` (under --receiver_prefix); returns its pid and
// address. The prefix must exec the receiver, not fork it, so that the
// receiver's parent stays this process and the pipe's end stays open.
std::pair<pid_t, std::string> SpawnReceiver(uint64_t size, bool checksums) {
  std::vector<std::string> args =
      absl::StrSplit(absl::GetFlag(FLAGS_receiver_prefix), ' ', absl::SkipEmpty());
  const std::string self = SelfPath();
  int fds[2];
  CHECK(pipe(fds) == 0);
  const pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    args.insert(
        args.end(),
        {self, "--role=receiver", absl::StrCat("--ready_fd=", fds[1]),
         absl::StrCat("--size=", size), absl::StrCat("--layers=", absl::GetFlag(FLAGS_layers)),
         absl::StrCat("--slices=", absl::GetFlag(FLAGS_slices)),
         absl::StrCat("--verify=", checksums),
         absl::StrCat("--verify_threads=", absl::GetFlag(FLAGS_verify_threads)),
         absl::StrCat("--detect_peer_failure=", absl::GetFlag(FLAGS_detect_peer_failure)),
         absl::StrCat("--huge_pages=", absl::GetFlag(FLAGS_huge_pages))});
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    _exit(127);
  }
  close(fds[1]);
  std::string line;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  char c;
  while (absl::Now() < deadline) {
    pollfd fd{fds[0], POLLIN, 0};
    if (poll(&fd, 1, 100) <= 0) continue;
    if (read(fds[0], &c, 1) != 1 || c == '\n') break;
    line.push_back(c);
  }
  close(fds[0]);
  CHECK(!line.empty()) << "the receiver process did not start";
  return {pid, absl::HexStringToBytes(line)};
}

double Percentile(std::vector<double> values, double p) {
  std::sort(values.begin(), values.end());
  return values[std::min(values.size() - 1, static_cast<size_t>(p * values.size()))];
}

// The XXH3-64 of each of the `layers` layers of `size` bytes at `kv`, and
// the hashing rate in GB/s (what a prefill worker's compute thread spends on
// them as it writes them).
std::pair<std::vector<uint64_t>, double> HashLayers(const char* kv, uint64_t size, int layers) {
  std::vector<uint64_t> sums(layers);
  const absl::Time start = absl::Now();
  for (int layer = 0; layer < layers; ++layer) sums[layer] = XXH3_64bits(kv + layer * size, size);
  const double seconds = std::max(1e-9, absl::ToDoubleSeconds(absl::Now() - start));
  return {sums, double(size) * layers / seconds / 1e9};
}

// Sender-side hashing rates, per size, of the runs with checksums.
absl::flat_hash_map<uint64_t, std::vector<double>> hash_gbps;

Result RunSender(uint64_t size, int lanes, bool checksums) {
  const int layers = absl::GetFlag(FLAGS_layers);
  const int parts = absl::GetFlag(FLAGS_slices);
  const auto [pid, address] = SpawnReceiver(size, checksums);
  absl::StatusOr<std::unique_ptr<UcxTransport>> transport =
      UcxTransport::Create(TransportOptions());
  CHECK_OK(transport.status());
  std::vector<PeerId> peers;
  for (int i = 0; i < lanes; ++i) {
    absl::StatusOr<PeerId> peer = (*transport)->Connect(address);
    CHECK_OK(peer.status());
    peers.push_back(*peer);
  }
  std::shared_ptr<char> kv = AllocateBuffer(size * layers);
  for (uint64_t i = 0; i < size * layers; ++i) kv.get()[i] = static_cast<char>(i * 131 + i / 4099);
  std::vector<uint64_t> sums;
  if (checksums) {
    double gbps = 0;
    std::tie(sums, gbps) = HashLayers(kv.get(), size, layers);
    hash_gbps[size].push_back(gbps);
  }
  absl::StatusOr<RegionId> region =
      (*transport)->RegisterMemory(kv.get(), size * layers, MemoryKind::kHost);
  CHECK_OK(region.status());

  const absl::Time give_up = absl::Now() + kConfigTimeout;
  std::vector<TransportEvent> events;
  // Posts every layer of `transfer`, then polls until at most `in_flight`
  // transfers await their answer; answer latencies of timed transfers go to
  // `latencies_us`.
  absl::flat_hash_map<uint64_t, absl::Time> started;
  std::vector<double> latencies_us;
  int sends_left = 0;
  auto drain = [&](size_t in_flight, bool timed) {
    while (started.size() > in_flight || (in_flight == 0 && sends_left > 0)) {
      CHECK(absl::Now() < give_up) << "transfers did not finish in time";
      events.clear();
      (*transport)->Poll(events);
      if (events.empty() && absl::GetFlag(FLAGS_sender_waits)) {
        (*transport)->WaitForActivity(absl::Now() + absl::Milliseconds(1));
      }
      for (const TransportEvent& event : events) {
        CHECK(event.kind != Kind::kPeerFailed) << event.status;
        if (event.kind == Kind::kSendDone) {
          CHECK_OK(event.status);
          --sends_left;
        } else if (event.kind == Kind::kIncoming) {
          uint64_t transfer = 0;
          CHECK(absl::SimpleAtoi(event.header, &transfer) && started.contains(transfer))
              << "unexpected answer '" << event.header << "'";
          (*transport)->Discard(event.id);
          if (timed)
            latencies_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - started[transfer]));
          started.erase(transfer);
        }
      }
    }
  };
  auto post = [&](uint64_t transfer) {
    started[transfer] = absl::Now();
    for (int layer = 0; layer < layers; ++layer) {
      std::string header = absl::StrCat(transfer, " ", layer);
      if (checksums) absl::StrAppend(&header, " ", sums[layer]);
      CHECK_OK(
          (*transport)
              ->PostSend(peers[layer % lanes], header, Slices(*region, layer * size, size, parts))
              .status());
      ++sends_left;
    }
  };
  // Each transfer in flight reuses the same source layers: the receiver
  // places them into the same slots, as a decode worker would not, but the
  // bytes moved and the protocol are the same.
  const int warmup = absl::GetFlag(FLAGS_warmup);
  const int transfers = absl::GetFlag(FLAGS_transfers);
  const size_t in_flight = std::max(1, absl::GetFlag(FLAGS_in_flight));
  for (int transfer = 0; transfer < warmup; ++transfer) {
    post(transfer);
    drain(0, false);
  }
  const absl::Time start = absl::Now();
  for (int transfer = warmup; transfer < warmup + transfers; ++transfer) {
    post(transfer);
    drain(in_flight - 1, true);
  }
  drain(0, true);
  const absl::Duration timed = absl::Now() - start;
  CHECK_OK((*transport)->PostSend(peers[0], "bye", {}).status());
  for (absl::Time until = absl::Now() + absl::Milliseconds(200); absl::Now() < until;) {
    events.clear();
    (*transport)->Poll(events);
  }
  for (PeerId peer : peers) (*transport)->Disconnect(peer);
  transport->reset();
  int status = 0;
  for (absl::Time until = absl::Now() + absl::Seconds(5); absl::Now() < until;) {
    if (waitpid(pid, &status, WNOHANG) == pid) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, WNOHANG);

  const double bytes = double(size) * layers * absl::GetFlag(FLAGS_transfers);
  return {size,
          lanes,
          checksums,
          bytes / absl::ToDoubleSeconds(timed) / 1e9,
          Percentile(latencies_us, 0.5),
          Percentile(latencies_us, 0.99)};
}

// Runs `command` and returns its output, or nothing when it fails to start.
std::optional<std::string> Capture(const std::string& command) {
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return std::nullopt;
  std::string out;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  if (pclose(pipe) != 0) return std::nullopt;
  return out;
}

// ucx_perftest -t tag_bw on loopback at `size`, with endpoint error handling
// (-e) or without: GB/s, or nothing when the tool is absent or fails. Its
// "Final:" line gives the overall bandwidth in MB/s of 2^20 bytes.
std::optional<double> RunPerftest(uint64_t size, bool error_handling) {
  if (access("/usr/bin/ucx_perftest", X_OK) != 0) return std::nullopt;
  const int iterations =
      static_cast<int>(std::clamp<uint64_t>((uint64_t{4} << 30) / size, 200, 20000));
  const std::string args =
      absl::StrCat(" -t tag_bw -s ", size, " -n ", iterations, " -p ",
                   absl::GetFlag(FLAGS_perftest_port), error_handling ? " -e" : "");
  // The server runs in the background with a time limit; the client retries
  // until the server listens.
  const std::string command =
      absl::StrCat("timeout 60 ucx_perftest", args, " >/dev/null 2>&1 & sleep 0.5; ",
                   "timeout 60 ucx_perftest 127.0.0.1", args, " 2>&1; wait");
  std::optional<std::string> out = Capture(absl::StrCat("sh -c '", command, "'"));
  if (!out.has_value()) return std::nullopt;
  for (absl::string_view line : absl::StrSplit(*out, '\n')) {
    if (!absl::StartsWith(line, "Final:")) continue;
    std::vector<absl::string_view> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
    double mb_per_s = 0;
    if (fields.size() >= 7 && absl::SimpleAtod(fields[6], &mb_per_s)) {
      return mb_per_s * (1 << 20) / 1e9;
    }
  }
  return std::nullopt;
}

// One core's memcpy of a transfer's layers from one buffer into another of
// the same shape, in GB/s: the limit for moving that working set with one
// copy, which is what UCX's shared-memory rendezvous (cma) does; TCP copies
// twice. ucx_perftest resends one cached buffer, so it sees none of this.
double MeasureMemcpy(uint64_t size, int layers) {
  std::shared_ptr<char> from = AllocateBuffer(size * layers);
  std::shared_ptr<char> to = AllocateBuffer(size * layers);
  memset(from.get(), 'k', size * layers);
  const int rounds = std::max(4, static_cast<int>((uint64_t{1} << 30) / (size * layers)));
  double best = 0.0;
  for (int repeat = 0; repeat < 3; ++repeat) {
    const absl::Time start = absl::Now();
    for (int round = 0; round < rounds; ++round) {
      for (int layer = 0; layer < layers; ++layer) {
        memcpy(to.get() + layer * size, from.get() + layer * size, size);
      }
    }
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    best = std::max(best, double(size) * layers * rounds / seconds / 1e9);
  }
  CHECK(to.get()[size * layers - 1] == 'k');
  return best;
}

int RunBench() {
  if (absl::GetFlag(FLAGS_max_sends_in_flight) < 1 || absl::GetFlag(FLAGS_layers) < 1) {
    std::cerr << "--max_sends_in_flight and --layers must be at least 1\n";
    return 2;
  }
  const char* tls_env = std::getenv("UCX_TLS");
  const std::string tls = tls_env != nullptr ? tls_env : "default";
  std::vector<uint64_t> sizes;
  for (const std::string& text : absl::GetFlag(FLAGS_sizes)) sizes.push_back(ParseSize(text));
  std::vector<int> lane_counts;
  for (const std::string& text : absl::GetFlag(FLAGS_lanes)) {
    int lanes = 0;
    CHECK(absl::SimpleAtoi(text, &lanes) && lanes > 0) << "bad --lanes value '" << text << "'";
    lane_counts.push_back(lanes);
  }
  std::vector<bool> checksum_settings;
  for (const std::string& text : absl::GetFlag(FLAGS_checksums)) {
    CHECK(text == "on" || text == "off") << "bad --checksums value '" << text << "' (on, off)";
    checksum_settings.push_back(text == "on");
  }
  CHECK(!checksum_settings.empty()) << "--checksums needs on, off or both";
  // The configurations of one size: every lane count, without and with
  // checksums.
  std::vector<std::pair<int, bool>> configs;
  for (int lanes : lane_counts) {
    for (bool checksums : checksum_settings) configs.emplace_back(lanes, checksums);
  }
  // Each repeat runs ucx_perftest and then every lane count at one size
  // back to back, so that both see the same machine load.
  std::vector<Result> results;
  // Per size: ucx_perftest without and with (-e) error handling.
  absl::flat_hash_map<uint64_t, std::array<std::optional<double>, 2>> perftest;
  absl::flat_hash_map<uint64_t, double> memcpy_gbps;
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  for (uint64_t size : sizes) {
    std::array<std::vector<double>, 2> anchor_runs;
    std::vector<std::vector<Result>> runs(configs.size());
    for (int repeat = 0; repeat < repeats; ++repeat) {
      for (int error_handling = 0; error_handling < 2 && absl::GetFlag(FLAGS_perftest);
           ++error_handling) {
        if (std::optional<double> gbps = RunPerftest(size, error_handling == 1)) {
          anchor_runs[error_handling].push_back(*gbps);
        }
      }
      for (size_t i = 0; i < configs.size(); ++i) {
        runs[i].push_back(RunSender(size, configs[i].first, configs[i].second));
      }
    }
    for (int i = 0; i < 2; ++i) {
      if (!anchor_runs[i].empty()) perftest[size][i] = Percentile(anchor_runs[i], 0.5);
    }
    memcpy_gbps[size] = MeasureMemcpy(size, absl::GetFlag(FLAGS_layers));
    for (std::vector<Result>& lane_runs : runs) {
      std::sort(lane_runs.begin(), lane_runs.end(),
                [](const Result& a, const Result& b) { return a.gbps < b.gbps; });
      results.push_back(lane_runs[lane_runs.size() / 2]);
    }
  }

  std::cout << absl::StrFormat(
      "tandem-kvbench: UCX_TLS=%s, peer-failure detection %s, %d layers x %d transfers, %d "
      "slice(s) per message, median of %d\n",
      tls, absl::GetFlag(FLAGS_detect_peer_failure) ? "on" : "off", absl::GetFlag(FLAGS_layers),
      absl::GetFlag(FLAGS_transfers), absl::GetFlag(FLAGS_slices), repeats);
  std::cout << absl::StrFormat("%-8s %5s %4s %7s %8s %9s %9s | %-19s | %-19s | %-19s\n", "", "", "",
                               "", "", "", "", "ucx_perftest", "ucx_perftest -e",
                               "memcpy, same layers");
  std::cout << absl::StrFormat("%-8s %5s %4s %7s %8s %9s %9s | %9s %9s | %9s %9s | %9s %9s\n",
                               "size", "lanes", "xxh3", "GB/s", "vs off", "p50 (us)", "p99 (us)",
                               "GB/s", "ratio", "GB/s", "ratio", "GB/s", "ratio");
  // The same size and lane count without checksums, for the "vs off" ratio.
  auto unchecked = [&](const Result& r) -> std::optional<double> {
    for (const Result& o : results) {
      if (o.size == r.size && o.lanes == r.lanes && !o.checksums) return o.gbps;
    }
    return std::nullopt;
  };
  auto format = [](std::optional<double> value) {
    return value ? absl::StrFormat("%.2f", *value) : std::string("-");
  };
  auto json = [](std::optional<double> value) {
    return value ? absl::StrFormat("%.3f", *value) : std::string("null");
  };
  std::vector<std::string> json_rows;
  for (const Result& r : results) {
    std::optional<double> anchor[2], ratio[2];
    for (int i = 0; i < 2; ++i) {
      anchor[i] = perftest[r.size][i];
      if (anchor[i]) ratio[i] = r.gbps / *anchor[i];
    }
    const std::string size_text = r.size % (1 << 20) == 0 ? absl::StrCat(r.size >> 20, "MiB")
                                                          : absl::StrCat(r.size >> 10, "KiB");
    const double copy = memcpy_gbps[r.size];
    std::optional<double> vs_off;
    if (std::optional<double> off = unchecked(r); off && r.checksums) vs_off = r.gbps / *off;
    std::cout << absl::StrFormat(
        "%-8s %5d %4s %7.2f %8s %9.0f %9.0f | %9s %9s | %9s %9s | %9.2f %9.2f\n", size_text,
        r.lanes, r.checksums ? "on" : "off", r.gbps, format(vs_off), r.p50_us, r.p99_us,
        format(anchor[0]), format(ratio[0]), format(anchor[1]), format(ratio[1]), copy,
        r.gbps / copy);
    json_rows.push_back(absl::StrFormat(
        R"({"size":%d,"lanes":%d,"checksums":%s,"gbps":%.5f,"vs_unchecked":%s,"p50_us":%.1f,)"
        R"("p99_us":%.1f,"perftest_gbps":%s,"ratio":%s,"perftest_e_gbps":%s,"ratio_e":%s,)"
        R"("memcpy_gbps":%.3f})",
        r.size, r.lanes, r.checksums ? "true" : "false", r.gbps, json(vs_off), r.p50_us, r.p99_us,
        json(anchor[0]), json(ratio[0]), json(anchor[1]), json(ratio[1]), memcpy_gbps[r.size]));
  }
  for (uint64_t size : sizes) {
    if (hash_gbps[size].empty()) continue;
    std::cout << absl::StrFormat(
        "sender's hashing (XXH3-64, once per layer as written, outside the timed transfers): "
        "%.1f GB/s at %d bytes a layer, median\n",
        Percentile(hash_gbps[size], 0.5), size);
  }
  std::cout << absl::StrFormat(R"({"bench":"kvbench","ucx_tls":"%s","detect_peer_failure":%s,)"
                               R"("layers":%d,"transfers":%d,"slices":%d,"results":[%s]})",
                               tls, absl::GetFlag(FLAGS_detect_peer_failure) ? "true" : "false",
                               absl::GetFlag(FLAGS_layers), absl::GetFlag(FLAGS_transfers),
                               absl::GetFlag(FLAGS_slices), absl::StrJoin(json_rows, ","))
            << "\n";
  return 0;
}

}  // namespace
}  // namespace tandem::kvtransfer

int main(int argc, char** argv) {
  tandem::ParseToolFlags(argc, argv,
                         "tandem-kvbench: KV transfer bandwidth and latency over UCX between two "
                         "processes, beside ucx_perftest");
  if (absl::GetFlag(FLAGS_role) == "receiver") return tandem::kvtransfer::RunReceiver();
  return tandem::kvtransfer::RunBench();
}
