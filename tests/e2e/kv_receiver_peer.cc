// The decode side of the two-namespace KV transfer test: opens a lease over
// a KV-cache-shaped region, prints its descriptor (hex) on stdout, waits for
// the transfer and exits 0 only if every byte is right.
//
// Usage: kv_receiver_peer SEED
#include <cstdio>
#include <cstdlib>

#include "absl/strings/escaping.h"
#include "tests/e2e/kv_receiver_side.h"

int main(int argc, char** argv) {
  using tandem::kvtransfer::KvReceiverSide;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s SEED\n", argv[0]);
    return 2;
  }
  // The shape the namespace test sends: 16 layers of 12 blocks of 64 KiB,
  // two lanes' worth of chunks, checksummed.
  const tandem::kvtransfer::Shape shape{16, 48, 12, 65536, 2, 16384, true, "tcp"};
  auto side = KvReceiverSide::Create(shape, std::strtoull(argv[1], nullptr, 10));
  if (!side.ok()) {
    std::fprintf(stderr, "receiver: %s\n", side.status().ToString().c_str());
    return 1;
  }
  auto descriptor = (*side)->Lease(absl::Seconds(20));
  if (!descriptor.ok()) {
    std::fprintf(stderr, "receiver: %s\n", descriptor.status().ToString().c_str());
    return 1;
  }
  std::printf("%s\n", absl::BytesToHexString(*descriptor).c_str());
  std::fflush(stdout);
  (*side)->RunUntilDone(absl::Seconds(25));
  absl::Status result =
      (*side)->done_calls() == 1 ? (*side)->status() : absl::DeadlineExceededError("no result");
  if (result.ok()) result = (*side)->CheckBytes();
  if (!result.ok()) {
    std::fprintf(stderr, "receiver: %s\n", result.ToString().c_str());
    return 1;
  }
  // Let the completion reach the sender before the connection closes.
  const absl::Time until = absl::Now() + absl::Seconds(2);
  while (absl::Now() < until && !(*side)->receiver().idle()) (*side)->receiver().Poll();
  for (int i = 0; i < 200; ++i) {
    (*side)->receiver().Poll();
    absl::SleepFor(absl::Milliseconds(5));
  }
  return 0;
}
