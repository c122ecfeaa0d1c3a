#include "kvtransfer/wire_format.h"

#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tandem::kvtransfer {
namespace {

using ::tandem::testing::StatusIs;
using ::testing::HasSubstr;

MessageHeader SampleHeader() {
  MessageHeader h;
  h.type = MessageType::kData;
  h.request_id = 0x0102030405060708;
  h.generation = 99;
  h.layer = 31;
  h.lane = 3;
  h.offset = 1 << 20;
  h.length = 65536;
  h.has_checksum = true;
  h.checksum = 0xdeadbeefcafef00d;
  return h;
}

TEST(MessageHeaderTest, RoundTrips) {
  const std::string bytes = SampleHeader().Encode();
  ASSERT_EQ(bytes.size(), MessageHeader::kEncodedBytes);
  ASSERT_OK_AND_ASSIGN(MessageHeader h, MessageHeader::Parse(bytes));
  EXPECT_EQ(h.type, MessageType::kData);
  EXPECT_EQ(h.request_id, 0x0102030405060708u);
  EXPECT_EQ(h.generation, 99u);
  EXPECT_EQ(h.layer, 31u);
  EXPECT_EQ(h.lane, 3);
  EXPECT_EQ(h.offset, 1u << 20);
  EXPECT_EQ(h.length, 65536u);
  EXPECT_TRUE(h.has_checksum);
  EXPECT_EQ(h.checksum, 0xdeadbeefcafef00du);
}

TEST(MessageHeaderTest, IsLittleEndian) {
  const std::string bytes = SampleHeader().Encode();
  EXPECT_EQ(static_cast<unsigned char>(bytes[8]), 0x08);  // Low byte of request_id first.
  EXPECT_EQ(static_cast<unsigned char>(bytes[15]), 0x01);
}

TEST(MessageHeaderTest, RejectsGarbage) {
  std::string bytes = SampleHeader().Encode();
  EXPECT_THAT(MessageHeader::Parse(bytes.substr(0, 20)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("20 bytes")));
  EXPECT_THAT(MessageHeader::Parse(std::string(MessageHeader::kEncodedBytes, 'x')),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bad magic")));
  std::string newer = bytes;
  newer[4] = static_cast<char>(kWireVersion + 1);
  EXPECT_THAT(MessageHeader::Parse(newer),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(absl::StrCat("version ", kWireVersion + 1))));
  std::string bad_type = bytes;
  bad_type[6] = 9;
  EXPECT_THAT(MessageHeader::Parse(bad_type),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown type 9")));
  std::string bad_flags = bytes;
  bad_flags[7] = 4;
  EXPECT_THAT(MessageHeader::Parse(bad_flags), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(MessageHeaderTest, AbortCarriesItsStatusCode) {
  MessageHeader h;
  h.type = MessageType::kAbort;
  h.code = absl::StatusCode::kDeadlineExceeded;
  ASSERT_OK_AND_ASSIGN(MessageHeader parsed, MessageHeader::Parse(h.Encode()));
  EXPECT_EQ(parsed.code, absl::StatusCode::kDeadlineExceeded);
  h.code = absl::StatusCode::kOk;
  EXPECT_THAT(MessageHeader::Parse(h.Encode()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("status code 0")));
  std::string bad_code = SampleHeader().Encode();
  bad_code[30] = 2;
  EXPECT_THAT(MessageHeader::Parse(bad_code), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(MessageHeaderTest, ControlMessagesCarryNoRange) {
  MessageHeader h = SampleHeader();
  h.type = MessageType::kAbort;
  h.code = absl::StatusCode::kCancelled;
  EXPECT_THAT(MessageHeader::Parse(h.Encode()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("control message")));
}

TransferLease SampleLease() {
  TransferLease lease;
  lease.request_id = 42;
  lease.generation = 7;
  lease.deadline = absl::FromUnixMillis(1'700'000'000'123);
  lease.layer_bytes = {4096, 4096, 0, 100};
  lease.chunk_bytes = 1000;
  lease.checksums = true;
  lease.receiver_address = std::string("ucx\0addr", 8);
  lease.first_block = 3;
  return lease;
}

TEST(TransferLeaseTest, RoundTrips) {
  ASSERT_OK_AND_ASSIGN(TransferLease lease, TransferLease::Parse(SampleLease().Serialize()));
  EXPECT_EQ(lease.request_id, 42u);
  EXPECT_EQ(lease.generation, 7u);
  EXPECT_EQ(lease.deadline, absl::FromUnixMillis(1'700'000'000'123));
  EXPECT_THAT(lease.layer_bytes, ::testing::ElementsAre(4096, 4096, 0, 100));
  EXPECT_EQ(lease.chunk_bytes, 1000u);
  EXPECT_TRUE(lease.checksums);
  EXPECT_EQ(lease.receiver_address, std::string("ucx\0addr", 8));
  EXPECT_EQ(lease.total_bytes(), 8292u);
  EXPECT_EQ(lease.first_block, 3u);
}

TEST(TransferLeaseTest, InfiniteDeadlineRoundTrips) {
  TransferLease lease = SampleLease();
  lease.deadline = absl::InfiniteFuture();
  ASSERT_OK_AND_ASSIGN(TransferLease parsed, TransferLease::Parse(lease.Serialize()));
  EXPECT_EQ(parsed.deadline, absl::InfiniteFuture());
}

TEST(TransferLeaseTest, Chunking) {
  const TransferLease lease = SampleLease();
  EXPECT_EQ(lease.chunks_in_layer(0), 5u);
  EXPECT_EQ(lease.chunk_length(0, 0), 1000u);
  EXPECT_EQ(lease.chunk_length(0, 4), 96u);
  EXPECT_EQ(lease.chunks_in_layer(2), 1u);  // An empty layer still sends one message.
  EXPECT_EQ(lease.chunk_length(2, 0), 0u);
  EXPECT_EQ(lease.chunks_in_layer(3), 1u);
}

// A lease is another process's bytes: a chunk size near 2^64 must still
// give one chunk per non-empty layer (rounding up used to wrap to zero, and
// the sender then sent nothing for the layer).
TEST(TransferLeaseTest, HugeChunkBytesGiveOneChunk) {
  TransferLease lease = SampleLease();
  lease.chunk_bytes = std::numeric_limits<uint64_t>::max() - 1;
  EXPECT_EQ(lease.chunks_in_layer(0), 1u);
  EXPECT_EQ(lease.chunk_length(0, 0), lease.layer_bytes[0]);
}

TEST(TransferLeaseTest, RejectsGarbage) {
  const std::string bytes = SampleLease().Serialize();
  EXPECT_THAT(TransferLease::Parse(""), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(TransferLease::Parse(bytes.substr(0, bytes.size() - 1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("its fields need")));
  EXPECT_THAT(TransferLease::Parse(bytes + "x"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(TransferLease::Parse(MessageHeader().Encode()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bad magic")));
  TransferLease no_layers = SampleLease();
  no_layers.layer_bytes.clear();
  EXPECT_THAT(TransferLease::Parse(no_layers.Serialize()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("0 layers")));
  TransferLease no_chunk = SampleLease();
  no_chunk.chunk_bytes = 0;
  EXPECT_THAT(TransferLease::Parse(no_chunk.Serialize()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("chunk_bytes")));
  TransferLease far = SampleLease();
  far.first_block = TransferLease::kMaxFirstBlock + 1;
  EXPECT_THAT(TransferLease::Parse(far.Serialize()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("first block")));
  std::string reserved = bytes;
  reserved[52] = 1;
  EXPECT_THAT(TransferLease::Parse(reserved),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("reserved")));
}

}  // namespace
}  // namespace tandem::kvtransfer
