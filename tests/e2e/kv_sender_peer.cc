// The prefill side of the two-process KV transfer tests: sends the
// deterministic pattern of each layer to the lease given on the command line
// over UCX, layer by layer, and exits 0 once the receiver confirmed.
//
// Usage: kv_sender_peer DESCRIPTOR_HEX SEED LANES STALL_AFTER [LAYER_GAP_US]
//   STALL_AFTER >= 0: after that many layers, stop sending and sleep (the
//   test kills the process); -1: send everything.
//   LAYER_GAP_US: time between one layer's hand-over and the next (0), as a
//   prefill worker's compute paces it.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/time/clock.h"
#include "common/base/clock.h"
#include "kvtransfer/transfer_sender.h"
#include "kvtransfer/ucx/ucx_transport.h"
#include "kvtransfer/wire_format.h"
#include "tests/e2e/kv_pattern.h"

namespace tandem::kvtransfer {
namespace {

int Run(int argc, char** argv) {
  if (argc != 5 && argc != 6) {
    std::fprintf(stderr, "usage: %s DESCRIPTOR_HEX SEED LANES STALL_AFTER [LAYER_GAP_US]\n",
                 argv[0]);
    return 2;
  }
  const absl::Duration layer_gap = absl::Microseconds(argc == 6 ? std::atoi(argv[5]) : 0);
  const std::string descriptor = absl::HexStringToBytes(argv[1]);
  const uint64_t seed = std::strtoull(argv[2], nullptr, 10);
  const int lanes = std::atoi(argv[3]);
  const int stall_after = std::atoi(argv[4]);
  auto lease = TransferLease::Parse(descriptor);
  if (!lease.ok()) {
    std::fprintf(stderr, "peer: bad descriptor: %s\n", lease.status().ToString().c_str());
    return 2;
  }
  auto transport = UcxTransport::Create();
  if (!transport.ok()) {
    std::fprintf(stderr, "peer: %s\n", transport.status().ToString().c_str());
    return 1;
  }
  // One contiguous source buffer, layer after layer.
  uint64_t total = 0;
  for (uint64_t b : lease->layer_bytes) total += b;
  std::vector<uint8_t> source(total == 0 ? 1 : total);
  SenderOptions options;
  options.lanes = lanes;
  TransferSender sender(transport->get(), &Clock::Real(), options);
  auto region = sender.RegisterMemory(source.data(), source.size(), MemoryKind::kHost);
  if (!region.ok()) {
    std::fprintf(stderr, "peer: %s\n", region.status().ToString().c_str());
    return 1;
  }
  SendRequest request;
  request.descriptor = descriptor;
  uint64_t at = 0;
  for (uint32_t l = 0; l < lease->layer_bytes.size(); ++l) {
    const uint64_t n = lease->layer_bytes[l];
    testing::FillKvPattern(seed, l, source.data() + at, n);
    request.layers.push_back({Slice{*region, at, n}});
    at += n;
  }
  request.deadline = absl::Now() + absl::Seconds(20);
  bool finished = false;
  absl::Status result;
  request.done = [&](uint64_t, const absl::Status& status) {
    finished = true;
    result = status;
  };
  auto id = sender.Start(std::move(request));
  if (!id.ok()) {
    std::fprintf(stderr, "peer: %s\n", id.status().ToString().c_str());
    return 1;
  }
  for (uint32_t l = 0; l < lease->layer_bytes.size(); ++l) {
    if (static_cast<int>(l) == stall_after) {
      // Keep the connection open but silent until the test kills us.
      const absl::Time until = absl::Now() + absl::Seconds(30);
      while (absl::Now() < until) {
        sender.Poll();
        absl::SleepFor(absl::Milliseconds(1));
      }
      return 3;
    }
    if (absl::Status s = sender.MarkLayerReady(*id, l); !s.ok()) {
      std::fprintf(stderr, "peer: %s\n", s.ToString().c_str());
      return 1;
    }
    sender.Poll();
    for (const absl::Time next = absl::Now() + layer_gap; absl::Now() < next;) {
      sender.WaitForActivity(next);
      sender.Poll();
    }
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(25);
  while (!finished && absl::Now() < deadline) {
    sender.Poll();
    sender.WaitForActivity(absl::Now() + absl::Milliseconds(5));
  }
  if (!finished || !result.ok()) {
    std::fprintf(stderr, "peer: transfer ended with %s\n",
                 finished ? result.ToString().c_str() : "no result before the deadline");
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace tandem::kvtransfer

int main(int argc, char** argv) { return tandem::kvtransfer::Run(argc, argv); }
