#include "common/model/safetensors.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/dtype.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tandem {
namespace {

using ::tandem::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string MakeTempDir() {
  std::string tmpl = ::testing::TempDir() + "/safetensors_test_XXXXXX";
  const char* dir = ::mkdtemp(tmpl.data());
  EXPECT_NE(dir, nullptr);
  return tmpl;
}

void WriteString(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
  ASSERT_TRUE(out.good()) << path;
}

// A file with `header` as the JSON text and `data_bytes` zero bytes of data.
std::string RawFile(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  uint64_t len = header.size();
  for (int i = 0; i < 8; ++i, len >>= 8) out[i] = static_cast<char>(len & 0xff);
  return out + header + std::string(data_bytes, '\0');
}

absl::StatusOr<SafetensorsFile> ParseString(std::string bytes) {
  auto storage = std::make_shared<const std::string>(std::move(bytes));
  const std::span<const uint8_t> span(reinterpret_cast<const uint8_t*>(storage->data()),
                                      storage->size());
  return SafetensorsFile::Parse(storage, span, "mem.safetensors");
}

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

TEST(DTypeTest, NamesSizesAndParsing) {
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16}) {
    EXPECT_THAT(ParseDType(DTypeName(d)), ::tandem::testing::IsOkAndHolds(d));
    EXPECT_EQ(ToDType(ToSafetensorsDType(d)), d);
  }
  EXPECT_THAT(ParseDType("BF16"), StatusIs(absl::StatusCode::kInvalidArgument,
                                           AllOf(HasSubstr("BF16"), HasSubstr("f32, f16, bf16"))));
  EXPECT_EQ(ParseSafetensorsDType("BF16"), SafetensorsDType::kBF16);
  EXPECT_EQ(ParseSafetensorsDType("bf16"), std::nullopt);
  EXPECT_EQ(ToDType(SafetensorsDType::kI64), std::nullopt);
  EXPECT_EQ(SafetensorsDTypeName(SafetensorsDType::kF8E4M3), "F8_E4M3");
  EXPECT_EQ(SafetensorsDTypeSize(SafetensorsDType::kF64), 8u);
}

struct Spec {
  std::string name;
  SafetensorsDType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

std::vector<Spec> SampleTensors() {
  return {
      {"bytes", SafetensorsDType::kU8, {3}, Pattern(3, 1)},
      {"model.layers.0.w", SafetensorsDType::kBF16, {2, 3}, Pattern(12, 2)},
      {"f32", SafetensorsDType::kF32, {4, 1, 2}, Pattern(32, 3)},
      {"half", SafetensorsDType::kF16, {5}, Pattern(10, 4)},
      {"ids", SafetensorsDType::kI64, {2}, Pattern(16, 5)},
      {"empty", SafetensorsDType::kF32, {0, 7}, {}},
      {"scalar", SafetensorsDType::kF32, {}, Pattern(4, 6)},
      {"scalar_bf16", SafetensorsDType::kBF16, {}, Pattern(2, 7)},
  };
}

void ExpectHolds(const TensorInfo* info, const Spec& spec) {
  ASSERT_NE(info, nullptr) << spec.name;
  EXPECT_EQ(info->name, spec.name);
  EXPECT_EQ(info->dtype, spec.dtype) << spec.name;
  EXPECT_EQ(info->shape, spec.shape) << spec.name;
  int64_t n = 1;
  for (int64_t d : spec.shape) n *= d;
  EXPECT_EQ(info->num_elements, n) << spec.name;
  EXPECT_EQ(std::vector<uint8_t>(info->bytes.begin(), info->bytes.end()), spec.bytes) << spec.name;
  // The writer lays out data so every tensor is aligned to its element size.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(info->bytes.data()) % SafetensorsDTypeSize(spec.dtype), 0u)
      << spec.name;
}

TEST(SafetensorsTest, RoundTripOfDtypesAndShapes) {
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/model.safetensors";
  SafetensorsWriter writer;
  for (const Spec& s : SampleTensors()) ASSERT_OK(writer.Add(s.name, s.dtype, s.shape, s.bytes));
  ASSERT_OK(writer.WriteFile(path));

  ASSERT_OK_AND_ASSIGN(SafetensorsFile file, SafetensorsFile::Open(path));
  EXPECT_EQ(file.path(), path);
  EXPECT_EQ(file.tensors().size(), SampleTensors().size());
  for (const Spec& s : SampleTensors()) ExpectHolds(file.Find(s.name), s);
  EXPECT_EQ(file.Find("missing"), nullptr);
  EXPECT_EQ(file.metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));

  // Header padded with spaces to an 8-byte aligned data section.
  const std::string bytes = writer.Serialize();
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  EXPECT_EQ(header_len % 8, 0u);
  EXPECT_EQ(bytes[8], '{');
  EXPECT_EQ(bytes.rfind("__metadata__"), 10u);
  ASSERT_OK(ParseString(bytes).status());
}

TEST(SafetensorsTest, KeepAliveOutlivesTheFile) {
  const std::string path = MakeTempDir() + "/a.safetensors";
  SafetensorsWriter writer;
  const std::vector<uint8_t> data = Pattern(16, 9);
  ASSERT_OK(writer.Add("w", SafetensorsDType::kF32, {4}, data));
  ASSERT_OK(writer.WriteFile(path));
  std::shared_ptr<const void> keep;
  std::span<const uint8_t> bytes;
  {
    ASSERT_OK_AND_ASSIGN(SafetensorsFile file, SafetensorsFile::Open(path));
    keep = file.keep_alive();
    bytes = file.Find("w")->bytes;
  }
  EXPECT_EQ(std::vector<uint8_t>(bytes.begin(), bytes.end()), data);
}

TEST(SafetensorsTest, ShardedRoundTrip) {
  const std::string dir = MakeTempDir();
  SafetensorsWriter writer;
  for (const Spec& s : SampleTensors()) ASSERT_OK(writer.Add(s.name, s.dtype, s.shape, s.bytes));
  ASSERT_OK(writer.WriteFolder(dir, /*max_shard_bytes=*/20));
  struct stat st;
  EXPECT_NE(::stat((dir + "/model.safetensors").c_str(), &st), 0);

  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SafetensorsModel> model, OpenSafetensorsFolder(dir));
  EXPECT_GT(model->shards().size(), 2u);
  EXPECT_THAT(model->shards()[0].path(), HasSubstr("model-00001-of-0000"));
  for (const Spec& s : SampleTensors()) ExpectHolds(model->Find(s.name), s);
  EXPECT_EQ(model->tensor_names().size(), SampleTensors().size());
  EXPECT_EQ(model->metadata().at("total_size"), "79");

  std::shared_ptr<const void> keep = model->keep_alive();
  const std::span<const uint8_t> ids = model->Find("ids")->bytes;
  model.reset();
  EXPECT_EQ(std::vector<uint8_t>(ids.begin(), ids.end()), Pattern(16, 5));
}

TEST(SafetensorsTest, FolderWithOneFile) {
  const std::string dir = MakeTempDir();
  SafetensorsWriter writer;
  ASSERT_OK(writer.Add("x", SafetensorsDType::kBF16, {2}, Pattern(4, 0)));
  writer.SetMetadata("source", "test");
  ASSERT_OK(writer.WriteFolder(dir, /*max_shard_bytes=*/1024));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SafetensorsModel> model, OpenSafetensorsFolder(dir));
  EXPECT_EQ(model->shards().size(), 1u);
  EXPECT_THAT(model->tensor_names(), ElementsAre("x"));
  EXPECT_EQ(model->metadata().at("source"), "test");
}

TEST(SafetensorsTest, EmptyFolderIsNotFound) {
  const std::string dir = MakeTempDir();
  EXPECT_THAT(OpenSafetensorsFolder(dir), StatusIs(absl::StatusCode::kNotFound, HasSubstr(dir)));
}

TEST(SafetensorsTest, MissingFileIsNotFound) {
  const std::string path = MakeTempDir() + "/nope.safetensors";
  EXPECT_THAT(SafetensorsFile::Open(path), StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
}

TEST(SafetensorsTest, ZeroSizedTensorsOverlapNothingAndGapsAreAllowed) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                             R"("b":{"dtype":"U8","shape":[2],"data_offsets":[12,14]}})";
  ASSERT_OK_AND_ASSIGN(SafetensorsFile file, ParseString(RawFile(header, 16)));
  EXPECT_THAT(file.tensor_names(), ElementsAre("a", "e", "b"));
}

TEST(SafetensorsTest, HeaderMayBePaddedWithSpaces) {
  const std::string header = R"({"a":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]}}    )";
  ASSERT_OK_AND_ASSIGN(SafetensorsFile file, ParseString(RawFile(header, 2)));
  EXPECT_NE(file.Find("a"), nullptr);
}

// Each case is written to a file and must fail with INVALID_ARGUMENT and a
// message holding the path and every one of `expected`.
struct BadCase {
  std::string test_name;
  std::string contents;
  std::vector<std::string> expected;
};

std::string Entry(const std::string& name, const std::string& body) {
  return absl::StrCat("\"", name, "\":{", body, "}");
}

std::vector<BadCase> BadCases() {
  const std::string ok_a = Entry("a", R"("dtype":"F32","shape":[2],"data_offsets":[0,8])");
  std::string huge_len(8, '\0');
  huge_len[4] = 1;  // 2^32
  return {
      {"Truncated", std::string(5, '\0'), {"5 bytes", "too short"}},
      {"HeaderLengthPastEnd",
       RawFile("{}", 0).substr(0, 8) + "{",
       {"header length 2", "past the end"}},
      {"HeaderLengthTooLarge", huge_len + "{}", {"header length 4294967296", "exceeds"}},
      {"HeaderNotJson", RawFile("{\"a\": ", 0), {"header", "not valid JSON"}},
      {"HeaderNotUtf8", RawFile("{\"\xff\": 1}", 0), {"not valid JSON"}},
      {"HeaderNotObject", RawFile("[1, 2]", 0), {"header is an array", "not a JSON object"}},
      {"EntryNotObject", RawFile("{\"a\": 3}", 0), {"tensor 'a'", "a number, not an object"}},
      {"MissingDtype",
       RawFile("{" + Entry("a", R"("shape":[2],"data_offsets":[0,8])") + "}", 8),
       {"tensor 'a'", "field 'dtype' is missing"}},
      {"MissingShape",
       RawFile("{" + Entry("a", R"("dtype":"F32","data_offsets":[0,8])") + "}", 8),
       {"tensor 'a'", "field 'shape' is missing"}},
      {"MissingDataOffsets",
       RawFile("{" + Entry("a", R"("dtype":"F32","shape":[2])") + "}", 8),
       {"tensor 'a'", "field 'data_offsets' is missing"}},
      {"DtypeNotString",
       RawFile("{" + Entry("a", R"("dtype":4,"shape":[2],"data_offsets":[0,8])") + "}", 8),
       {"tensor 'a'", "field 'dtype'", "not a string"}},
      {"UnknownDtype",
       RawFile("{" + Entry("a", R"("dtype":"F17","shape":[2],"data_offsets":[0,8])") + "}", 8),
       {"tensor 'a'", "field 'dtype'", "unknown dtype 'F17'"}},
      {"NegativeDimension",
       RawFile("{" + Entry("a", R"("dtype":"F32","shape":[-2],"data_offsets":[0,8])") + "}", 8),
       {"tensor 'a'", "field 'shape'", "-2"}},
      {"FractionalDimension",
       RawFile("{" + Entry("a", R"("dtype":"F32","shape":[2.0],"data_offsets":[0,8])") + "}", 8),
       {"tensor 'a'", "field 'shape'"}},
      {"ShapeOverflows",
       RawFile(
           "{" +
               Entry("a",
                     R"("dtype":"F32","shape":[4294967296,4294967296,0],"data_offsets":[0,0])") +
               "}",
           0),
       {"tensor 'a'", "field 'shape'", "too many elements"}},
      {"ElementBytesOverflow",
       RawFile(
           "{" + Entry("a", R"("dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,0])") +
               "}",
           0),
       {"tensor 'a'", "field 'shape'", "too many elements"}},
      {"OffsetsNotPair",
       RawFile("{" + Entry("a", R"("dtype":"F32","shape":[2],"data_offsets":[0])") + "}", 8),
       {"tensor 'a'", "field 'data_offsets'", "[begin, end]"}},
      {"OffsetsOutOfRange",
       RawFile("{" + Entry("a", R"("dtype":"F32","shape":[2],"data_offsets":[4,12])") + "}", 8),
       {"tensor 'a'", "field 'data_offsets'", "past the data section (8 bytes)"}},
      {"EndBeforeBegin",
       RawFile("{" + Entry("a", R"("dtype":"F32","shape":[2],"data_offsets":[8,0])") + "}", 8),
       {"tensor 'a'", "field 'data_offsets'", "end 0 < begin 8"}},
      {"SizeMismatch",
       RawFile("{" + Entry("a", R"("dtype":"BF16","shape":[2,3],"data_offsets":[0,8])") + "}", 8),
       {"tensor 'a'", "field 'data_offsets'", "holds 8 bytes", "field 'shape' [2,3]", "needs 12"}},
      {"Overlap",
       RawFile("{" + ok_a + "," + Entry("b", R"("dtype":"F32","shape":[2],"data_offsets":[4,12])") +
                   "}",
               12),
       {"tensor 'b'", "field 'data_offsets' [4, 12] overlaps tensor 'a' [0, 8]"}},
      {"DuplicateName",
       RawFile("{" + ok_a + "," + Entry("a", R"("dtype":"F32","shape":[2],"data_offsets":[8,16])") +
                   "}",
               16),
       {"tensor 'a' appears twice"}},
      {"DuplicateField",
       RawFile("{" + Entry("a", R"("dtype":"F32","dtype":"F16","shape":[2],"data_offsets":[0,8])") +
                   "}",
               8),
       {"under 'a'", "key 'dtype' appears twice"}},
      {"MetadataNotObject",
       RawFile(R"({"__metadata__": []})", 0),
       {"field '__metadata__'", "not an object"}},
      {"MetadataValueNotString",
       RawFile(R"({"__metadata__": {"format": 1}})", 0),
       {"field '__metadata__'", "value of 'format'", "not a string"}},
  };
}

TEST(SafetensorsTest, RejectsBadFilesNamingFileTensorAndField) {
  const std::string dir = MakeTempDir();
  for (const BadCase& c : BadCases()) {
    SCOPED_TRACE(c.test_name);
    const std::string path = absl::StrCat(dir, "/", c.test_name, ".safetensors");
    WriteString(path, c.contents);
    const absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
    EXPECT_THAT(file, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(path)));
    for (const std::string& want : c.expected) {
      EXPECT_THAT(file, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(want)));
    }
  }
}

// A two-shard folder: a.safetensors holds "x", b.safetensors holds "y".
class ShardIndexTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    WriteShard("a.safetensors", "x");
    WriteShard("b.safetensors", "y");
  }
  void WriteShard(const std::string& file, const std::string& tensor) {
    SafetensorsWriter writer;
    ASSERT_OK(writer.Add(tensor, SafetensorsDType::kF32, {1}, Pattern(4, 0)));
    ASSERT_OK(writer.WriteFile(dir_ + "/" + file));
  }
  void WriteIndex(const std::string& weight_map) {
    WriteString(dir_ + "/model.safetensors.index.json",
                R"({"metadata": {"total_size": 8}, "weight_map": )" + weight_map + "}");
  }
  std::string index_path() const { return dir_ + "/model.safetensors.index.json"; }
  std::string dir_;
};

TEST_F(ShardIndexTest, OpensAValidIndex) {
  WriteIndex(R"({"x": "a.safetensors", "y": "b.safetensors"})");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SafetensorsModel> model, OpenSafetensorsFolder(dir_));
  EXPECT_THAT(model->tensor_names(), ElementsAre("x", "y"));
  EXPECT_EQ(model->metadata().at("total_size"), "8");
}

TEST_F(ShardIndexTest, MissingShardIsNotFound) {
  WriteIndex(R"({"x": "a.safetensors", "y": "c.safetensors"})");
  EXPECT_THAT(OpenSafetensorsFolder(dir_),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("c.safetensors")));
}

TEST_F(ShardIndexTest, TensorNotInTheShardItNames) {
  WriteIndex(R"({"x": "a.safetensors", "y": "a.safetensors"})");
  // b.safetensors is not listed, so only a.safetensors is opened.
  EXPECT_THAT(OpenSafetensorsFolder(dir_),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(index_path()), HasSubstr("tensor 'y' is not in"),
                             HasSubstr("a.safetensors"))));
}

TEST_F(ShardIndexTest, PathTraversalShardNames) {
  for (const std::string bad : {"../a.safetensors", "sub/a.safetensors", "..", "/etc/passwd", ""}) {
    SCOPED_TRACE(bad);
    WriteIndex(R"({"x": ")" + bad + R"(", "y": "b.safetensors"})");
    EXPECT_THAT(OpenSafetensorsFolder(dir_),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr(index_path()), HasSubstr("tensor 'x'"),
                               HasSubstr("not a plain file name"))));
  }
}

TEST_F(ShardIndexTest, TensorInTwoShards) {
  WriteShard("b.safetensors", "x");  // now both shards hold "x"
  WriteIndex(R"({"x": "a.safetensors", "z": "b.safetensors"})");
  EXPECT_THAT(OpenSafetensorsFolder(dir_),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tensor 'z' is not in")));
  // With every listed tensor found, the copy in the other shard is still an error.
  {
    SafetensorsWriter writer;
    ASSERT_OK(writer.Add("x", SafetensorsDType::kF32, {1}, Pattern(4, 0)));
    ASSERT_OK(writer.Add("z", SafetensorsDType::kF32, {1}, Pattern(4, 0)));
    ASSERT_OK(writer.WriteFile(dir_ + "/b.safetensors"));
  }
  EXPECT_THAT(OpenSafetensorsFolder(dir_),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("tensor 'x' is in both"), HasSubstr("a.safetensors"),
                             HasSubstr("b.safetensors"))));
}

TEST_F(ShardIndexTest, TensorMissingFromWeightMap) {
  WriteIndex(R"({"x": "a.safetensors"})");
  WriteShard("a.safetensors", "x");
  {
    SafetensorsWriter writer;
    ASSERT_OK(writer.Add("x", SafetensorsDType::kF32, {1}, Pattern(4, 0)));
    ASSERT_OK(writer.Add("extra", SafetensorsDType::kF32, {1}, Pattern(4, 0)));
    ASSERT_OK(writer.WriteFile(dir_ + "/a.safetensors"));
  }
  EXPECT_THAT(OpenSafetensorsFolder(dir_),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("tensor 'extra'"), HasSubstr("not listed"))));
}

TEST_F(ShardIndexTest, MalformedIndex) {
  WriteString(index_path(), "[]");
  EXPECT_THAT(OpenSafetensorsFolder(dir_),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(index_path()), HasSubstr("not a JSON object"))));
  WriteString(index_path(), R"({"metadata": {}})");
  EXPECT_THAT(OpenSafetensorsFolder(dir_),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("field 'weight_map'")));
  WriteIndex(R"({"x": 3})");
  EXPECT_THAT(OpenSafetensorsFolder(dir_),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("tensor 'x'"), HasSubstr("not a file name"))));
  WriteIndex(R"({"x": "a.safetensors", "x": "b.safetensors"})");
  EXPECT_THAT(OpenSafetensorsFolder(dir_),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("key 'x' appears twice")));
}

TEST(SafetensorsWriterTest, RejectsBadTensors) {
  SafetensorsWriter writer;
  EXPECT_THAT(writer.Add("a", SafetensorsDType::kF32, {2}, Pattern(4, 0)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("tensor 'a'"), HasSubstr("4 bytes"))));
  EXPECT_THAT(writer.Add("a", SafetensorsDType::kF32, {-1}, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bad shape")));
  EXPECT_THAT(writer.Add("__metadata__", SafetensorsDType::kU8, {}, Pattern(1, 0)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("reserved")));
  ASSERT_OK(writer.Add("a", SafetensorsDType::kU8, {}, Pattern(1, 0)));
  EXPECT_THAT(writer.Add("a", SafetensorsDType::kU8, {}, Pattern(1, 0)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("already added")));
}

// Guards against crashes and out-of-bounds reads on corrupt headers: a few
// thousand seeded mutations of a valid file either fail with
// INVALID_ARGUMENT or describe only bytes inside the buffer.
TEST(SafetensorsTest, RandomCorruptionNeverCrashes) {
  SafetensorsWriter writer;
  for (const Spec& s : SampleTensors()) ASSERT_OK(writer.Add(s.name, s.dtype, s.shape, s.bytes));
  const std::string valid = writer.Serialize();
  uint64_t header_len = 0;
  std::memcpy(&header_len, valid.data(), 8);
  const std::string interesting = "{}[]\",:0123456789-.e ";

  std::mt19937_64 rng(20240607);
  int accepted = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    std::string bytes = valid;
    const int mode = static_cast<int>(rng() % 5);
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t header_pos = 8 + rng() % header_len;
      switch (mode) {
        case 0:  // random byte in the header
          bytes[header_pos] = static_cast<char>(rng() & 0xff);
          break;
        case 1:  // a JSON-significant character in the header
          bytes[header_pos] = interesting[rng() % interesting.size()];
          break;
        case 2:  // a random byte of the length field
          bytes[rng() % 8] = static_cast<char>(rng() & 0xff);
          break;
        case 3: {  // length off by a little
          uint64_t len = header_len + (rng() % 33) - 16;
          std::memcpy(bytes.data(), &len, 8);
          break;
        }
        default:  // truncated anywhere
          bytes.resize(rng() % (bytes.size() + 1));
          break;
      }
    }
    const size_t size = bytes.size();
    auto storage = std::make_shared<const std::string>(std::move(bytes));
    const auto* base = reinterpret_cast<const uint8_t*>(storage->data());
    const absl::StatusOr<SafetensorsFile> file =
        SafetensorsFile::Parse(storage, {base, size}, "fuzz.safetensors");
    if (!file.ok()) {
      ASSERT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument) << file.status();
      continue;
    }
    ++accepted;
    for (const TensorInfo& t : file->tensors()) {
      ASSERT_GE(t.bytes.data(), base);
      ASSERT_LE(t.bytes.data() + t.bytes.size(), base + size);
      ASSERT_EQ(t.bytes.size(),
                static_cast<size_t>(t.num_elements) * SafetensorsDTypeSize(t.dtype));
    }
  }
  // Some mutations (spaces, digits in names) leave a valid file.
  EXPECT_GT(accepted, 0);
}

}  // namespace
}  // namespace tandem
