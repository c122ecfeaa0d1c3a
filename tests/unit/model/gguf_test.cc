#include "common/model/gguf.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "common/model/gguf_model.h"
#include "common/model/gguf_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/model_files.h"
#include "tests/testing/status_matchers.h"

namespace tandem {
namespace {

using ::tandem::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string WriteBytes(const std::string& name, const std::string& bytes) {
  const std::string path = ::tandem::testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), bytes.size());
  return path;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

template <typename T>
void Patch(std::string& bytes, size_t at, T v) {
  std::memcpy(bytes.data() + at, &v, sizeof(T));
}

// Offset of the `offset` field in the info of tensor `name` (its name is
// followed by n_dims, the dims and the type).
size_t OffsetFieldOf(const std::string& bytes, const std::string& name, int n_dims) {
  const size_t at = bytes.find(name);
  EXPECT_NE(at, std::string::npos);
  return at + name.size() + 4 + 8 * n_dims + 4;
}

// Expects opening `bytes` to fail with INVALID_ARGUMENT naming the file and
// containing `what`.
void ExpectInvalid(const std::string& bytes, const std::string& what) {
  const std::string path = WriteBytes("bad.gguf", bytes);
  EXPECT_THAT(GgufFile::Open(path).status(), StatusIs(absl::StatusCode::kInvalidArgument,
                                                      AllOf(HasSubstr(path), HasSubstr(what))));
}

std::vector<uint8_t> FloatBytes(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * 4);
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

TEST(Fp16Test, EveryHalfSurvivesARoundTrip) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = Fp16ToFp32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(Fp16ToFp32(Fp32ToFp16(f)))) << h;
      continue;
    }
    EXPECT_EQ(Fp32ToFp16(f), h) << "half 0x" << std::hex << h << " = " << f;
  }
}

TEST(Fp16Test, KnownValuesAndRoundingToNearestEven) {
  EXPECT_EQ(Fp16ToFp32(0x3c00), 1.0f);
  EXPECT_EQ(Fp16ToFp32(0xc000), -2.0f);
  EXPECT_EQ(Fp16ToFp32(0x7bff), 65504.0f);
  EXPECT_EQ(Fp16ToFp32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(Fp16ToFp32(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(Fp32ToFp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie, even below
  EXPECT_EQ(Fp32ToFp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie, even above
  EXPECT_EQ(Fp32ToFp16(1.0f + std::ldexp(1.1f, -11)), 0x3c01);      // above the tie
  EXPECT_EQ(Fp32ToFp16(65519.0f), 0x7bff);
  EXPECT_EQ(Fp32ToFp16(65520.0f), 0x7c00);
  EXPECT_EQ(Fp32ToFp16(-1e10f), 0xfc00);
  EXPECT_EQ(Fp32ToFp16(std::ldexp(1.0f, -25)), 0x0000);     // tie to zero
  EXPECT_EQ(Fp32ToFp16(std::ldexp(3.0f, -26)), 0x0001);     // above the tie
  EXPECT_EQ(Fp32ToFp16(std::ldexp(1023.5f, -24)), 0x0400);  // rounds up to the smallest normal
  EXPECT_EQ(Fp32ToFp16(-0.0f), 0x8000);
  EXPECT_TRUE(std::isnan(Fp16ToFp32(Fp32ToFp16(std::nanf("")))));
  EXPECT_EQ(Bf16ToFp32(0x3f80), 1.0f);
  EXPECT_EQ(Bf16ToFp32(0xc040), -3.0f);
}

TEST(GgufFileTest, ReadsTheLlamaVocabularyFixture) {
  TANDEM_MODEL_FILE_OR_SKIP(path, "ggml-vocab-llama-spm.gguf");
  ASSERT_OK_AND_ASSIGN(GgufFile file, GgufFile::Open(path));
  EXPECT_EQ(file.version(), 3u);
  EXPECT_EQ(file.alignment(), 32u);
  EXPECT_TRUE(file.tensors().empty());
  EXPECT_EQ(file.metadata().size(), 22u);
  EXPECT_EQ(file.metadata()[0].key, "general.architecture");
  EXPECT_THAT(file.GetString("general.architecture"), ::tandem::testing::IsOkAndHolds("llama"));
  EXPECT_THAT(file.GetString("tokenizer.ggml.model"), ::tandem::testing::IsOkAndHolds("llama"));
  EXPECT_THAT(file.GetUint32("llama.context_length"), ::tandem::testing::IsOkAndHolds(4096u));
  EXPECT_THAT(file.GetUint32("llama.vocab_size"), ::tandem::testing::IsOkAndHolds(32000u));
  EXPECT_THAT(file.GetUint32("tokenizer.ggml.bos_token_id"), ::tandem::testing::IsOkAndHolds(1u));
  EXPECT_THAT(file.GetUint32("tokenizer.ggml.eos_token_id"), ::tandem::testing::IsOkAndHolds(2u));
  EXPECT_THAT(file.GetBool("tokenizer.ggml.add_bos_token"), ::tandem::testing::IsOkAndHolds(true));
  EXPECT_THAT(file.GetBool("tokenizer.ggml.add_eos_token"), ::tandem::testing::IsOkAndHolds(false));
  ASSERT_OK_AND_ASSIGN(float eps, file.GetFloat("llama.attention.layer_norm_rms_epsilon"));
  EXPECT_FLOAT_EQ(eps, 1e-5f);

  ASSERT_OK_AND_ASSIGN(std::vector<std::string> tokens,
                       file.GetStringArray("tokenizer.ggml.tokens"));
  ASSERT_EQ(tokens.size(), 32000u);
  EXPECT_EQ(tokens[0], "<unk>");
  EXPECT_EQ(tokens[1], "<s>");
  EXPECT_EQ(tokens[2], "</s>");
  EXPECT_EQ(tokens[3], "<0x00>");
  EXPECT_EQ(tokens[259], "\xe2\x96\x81\xe2\x96\x81");  // "▁▁", the first piece after the bytes
  ASSERT_OK_AND_ASSIGN(std::vector<float> scores, file.GetFloatArray("tokenizer.ggml.scores"));
  ASSERT_EQ(scores.size(), 32000u);
  EXPECT_EQ(scores[0], 0.0f);
  EXPECT_EQ(scores[259], -1e9f);
  EXPECT_EQ(scores[31999], -31740.0f);
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> types, file.GetInt32Array("tokenizer.ggml.token_type"));
  ASSERT_EQ(types.size(), 32000u);
  EXPECT_THAT(std::vector<int32_t>(types.begin(), types.begin() + 4), ElementsAre(2, 3, 3, 6));
  EXPECT_EQ(types[1000], 1);

  EXPECT_THAT(file.GetUint32("no.such.key"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no.such.key")));
  EXPECT_THAT(file.GetString("llama.block_count"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("uint32"), HasSubstr("string"))));
  EXPECT_THAT(file.GetFloatArray("tokenizer.ggml.tokens"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("array of string")));
  EXPECT_THAT(file.GetUint32("tokenizer.ggml.scores"),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(GgufFileTest, LoadingTheVocabularyFixtureAsAModelFailsCleanly) {
  TANDEM_MODEL_FILE_OR_SKIP(path, "ggml-vocab-llama-spm.gguf");
  EXPECT_THAT(LoadGgufModel(path).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(path), HasSubstr("no tensors"))));
}

TEST(GgufFileTest, TruncatedVocabularyFixtureIsInvalid) {
  TANDEM_MODEL_FILE_OR_SKIP(path, "ggml-vocab-llama-spm.gguf");
  const std::string bytes = ReadBytes(path);
  // Inside the magic, the counts, a key, a scalar value, the token array,
  // the score array; one byte short.
  for (size_t cut : {2ul, 20ul, 40ul, 140ul, 1000ul, 400000ul, 600000ul, bytes.size() - 1}) {
    SCOPED_TRACE(cut);
    ExpectInvalid(bytes.substr(0, cut), cut < 4 ? "not a GGUF file" : "truncated");
  }
  ExpectInvalid(bytes + std::string(40, '\0'), "unexpected bytes");
}

TEST(GgufFileTest, EveryValueTypeRoundTrips) {
  GgufWriter w;
  w.AddUint8("u8", 200);
  w.AddInt8("i8", -100);
  w.AddUint16("u16", 60000);
  w.AddInt16("i16", -30000);
  w.AddUint32("u32", 4000000000u);
  w.AddInt32("i32", -2000000000);
  w.AddUint64("u64", 1ull << 40);
  w.AddInt64("i64", -(1ll << 40));
  w.AddFloat32("f32", 0.25f);
  w.AddFloat64("f64", -0.5);
  w.AddFloat64("f64_huge", 1e100);
  w.AddBool("yes", true);
  w.AddString("str", std::string("a\0b", 3));
  const std::vector<std::string> strings = {"x", "", "hello"};
  w.AddStringArray("strs", strings);
  const std::vector<float> floats = {1.5f, -2.0f};
  w.AddFloat32Array("floats", floats);
  const std::vector<int32_t> ints = {7, -8, 9};
  w.AddInt32Array("ints", ints);
  w.AddEncodedArray("empty", GgufValueType::kFloat32, 0, "");
  ASSERT_OK_AND_ASSIGN(std::string bytes, w.Serialize());
  ASSERT_OK_AND_ASSIGN(GgufFile f, GgufFile::Open(WriteBytes("types.gguf", bytes)));

  EXPECT_EQ(f.FindValue("u8")->type, GgufValueType::kUint8);
  EXPECT_EQ(*f.GetUint32("u8"), 200u);
  EXPECT_EQ(*f.GetInt32("i8"), -100);
  EXPECT_EQ(*f.GetUint32("u16"), 60000u);
  EXPECT_EQ(*f.GetInt32("i16"), -30000);
  EXPECT_EQ(*f.GetUint32("u32"), 4000000000u);
  EXPECT_EQ(*f.GetInt32("i32"), -2000000000);
  EXPECT_EQ(*f.GetUint64("u64"), 1ull << 40);
  EXPECT_EQ(*f.GetFloat("f32"), 0.25f);
  EXPECT_EQ(*f.GetFloat("f64"), -0.5f);
  EXPECT_THAT(f.GetFloat("f64_huge"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("out of range")));
  EXPECT_EQ(*f.GetBool("yes"), true);
  EXPECT_EQ(*f.GetString("str"), std::string("a\0b", 3));
  EXPECT_EQ(*f.GetStringArray("strs"), strings);
  EXPECT_EQ(*f.GetFloatArray("floats"), floats);
  EXPECT_EQ(*f.GetInt32Array("ints"), ints);
  EXPECT_TRUE(f.GetFloatArray("empty")->empty());
  EXPECT_EQ(f.FindValue("i64")->bytes.size(), 8u);

  // Integer getters check the range, not just the type.
  EXPECT_THAT(f.GetUint32("i8"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("-100")));
  EXPECT_THAT(f.GetInt32("u32"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("out of range")));
  EXPECT_THAT(f.GetUint64("i64"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(f.GetUint32("f32"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("float32")));
  EXPECT_THAT(f.GetBool("u8"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(f.GetStringArray("ints"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("int32")));
}

TEST(GgufFileTest, TensorsAreAlignedAndFoundByName) {
  GgufWriter w(64);
  w.AddTensor("a", {3}, GgmlType::kF32, FloatBytes({1, 2, 3}));
  w.AddTensor("q", {64, 2}, GgmlType::kQ8_0, std::vector<uint8_t>(4 * 34, 7));
  w.AddTensor("h", {2, 1}, GgmlType::kF16, std::vector<uint8_t>{0x00, 0x3c, 0x00, 0xc0});
  ASSERT_OK_AND_ASSIGN(std::string bytes, w.Serialize());
  const std::string path = WriteBytes("tensors.gguf", bytes);
  ASSERT_OK_AND_ASSIGN(GgufFile f, GgufFile::Open(path));
  EXPECT_EQ(f.alignment(), 64u);
  ASSERT_EQ(f.tensors().size(), 3u);
  const uint8_t* base = f.bytes().data();
  for (const GgufTensorInfo& t : f.tensors()) {
    EXPECT_EQ((t.data.data() - base) % 64, 0) << t.name;
  }
  const GgufTensorInfo* q = f.FindTensor("q");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->type, GgmlType::kQ8_0);
  EXPECT_THAT(q->dims, ElementsAre(64, 2));
  EXPECT_EQ(q->num_elements, 128);
  EXPECT_EQ(q->num_bytes, 4u * 34);
  EXPECT_EQ(q->data[0], 7);
  const GgufTensorInfo* a = f.FindTensor("a");
  float values[3];
  std::memcpy(values, a->data.data(), sizeof(values));
  EXPECT_THAT(values, ElementsAre(1, 2, 3));
  EXPECT_EQ(f.FindTensor("missing"), nullptr);

  // The data of every tensor is in the file, so every shorter cut is invalid.
  for (size_t cut = 0; cut < bytes.size() - 60; cut += 7) {
    SCOPED_TRACE(cut);
    ExpectInvalid(bytes.substr(0, cut), cut < 4 ? "not a GGUF file" : "truncated");
  }
}

TEST(GgufFileTest, ParsesBytesInMemoryAndKeepsThemAlive) {
  GgufWriter w;
  w.AddTensor("a", {3}, GgmlType::kF32, FloatBytes({1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(std::string serialized, w.Serialize());
  auto owned = std::make_shared<std::string>(serialized);
  const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(owned->data()),
                                       owned->size());
  ASSERT_OK_AND_ASSIGN(GgufFile f, GgufFile::Parse(owned, bytes, "in-memory.gguf"));
  owned.reset();  // the file holds the only reference now
  EXPECT_EQ(f.path(), "in-memory.gguf");
  EXPECT_EQ(f.bytes().data(), bytes.data());
  float values[3];
  std::memcpy(values, f.FindTensor("a")->data.data(), sizeof(values));
  EXPECT_THAT(values, ElementsAre(1, 2, 3));

  const std::string cut = serialized.substr(0, serialized.size() / 2);
  EXPECT_THAT(
      GgufFile::Parse(nullptr, std::span(reinterpret_cast<const uint8_t*>(cut.data()), cut.size()),
                      "cut.gguf")
          .status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("'cut.gguf'"), HasSubstr("truncated"))));
}

TEST(GgufFileTest, WriterChecksTensorSizes) {
  GgufWriter w;
  w.AddTensor("a", {4}, GgmlType::kF32, FloatBytes({1, 2, 3}));
  EXPECT_THAT(w.Serialize().status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'a' has 12 bytes")));
  GgufWriter q;
  q.AddTensor("q", {16, 2}, GgmlType::kQ8_0, std::vector<uint8_t>(34));
  EXPECT_THAT(q.Serialize().status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rows of 16 elements")));
}

TEST(GgufFileTest, RejectsBadHeaders) {
  GgufWriter w;
  w.AddUint32("k", 1);
  ASSERT_OK_AND_ASSIGN(std::string good, w.Serialize());
  ExpectInvalid("GGML" + good.substr(4), "not a GGUF file");
  ExpectInvalid("", "not a GGUF file");
  std::string v1 = good;
  Patch<uint32_t>(v1, 4, 1);
  ExpectInvalid(v1, "version 1");
  std::string big_endian = good;
  Patch<uint32_t>(big_endian, 4, 0x03000000);
  ExpectInvalid(big_endian, "big-endian");
  std::string many_entries = good;
  Patch<uint64_t>(many_entries, 16, uint64_t{1} << 60);
  ExpectInvalid(many_entries, "claims 1152921504606846976 metadata entries");
  std::string many_tensors = good;
  Patch<uint64_t>(many_tensors, 8, uint64_t{1} << 62);
  ExpectInvalid(many_tensors, "tensors");
}

TEST(GgufFileTest, RejectsBadMetadata) {
  auto serialize = [](const std::function<void(GgufWriter&)>& add) {
    GgufWriter w;
    add(w);
    return *w.Serialize();
  };
  ExpectInvalid(serialize([](GgufWriter& w) {
                  w.AddEncodedArray("huge", GgufValueType::kUint32, 1ull << 61, "");
                }),
                "array 'huge' claims 2305843009213693952 elements");
  ExpectInvalid(serialize([](GgufWriter& w) {
                  w.AddEncodedArray("s", GgufValueType::kString, 1ull << 40, "");
                }),
                "array 's' claims");
  ExpectInvalid(serialize([](GgufWriter& w) {
                  std::string encoding(8, '\0');
                  Patch<uint64_t>(encoding, 0, uint64_t{1} << 62);
                  w.AddEncoded("long", GgufValueType::kString, encoding);
                }),
                "truncated: the value of 'long' needs 4611686018427387904 bytes");
  ExpectInvalid(
      serialize([](GgufWriter& w) { w.AddEncoded("odd", static_cast<GgufValueType>(99), "x"); }),
      "unknown value type 99");
  ExpectInvalid(serialize([](GgufWriter& w) {
                  w.AddEncodedArray("odd", static_cast<GgufValueType>(13), 1, "x");
                }),
                "unknown element type 13");
  ExpectInvalid(
      serialize([](GgufWriter& w) { w.AddEncodedArray("nest", GgufValueType::kArray, 1, ""); }),
      "array of arrays");
  ExpectInvalid(serialize([](GgufWriter& w) {
                  w.AddUint32("dup", 1);
                  w.AddUint32("dup", 2);
                }),
                "repeats metadata key 'dup'");
  ExpectInvalid(serialize([](GgufWriter& w) { w.AddUint32("general.alignment", 24); }),
                "general.alignment 24");
  ExpectInvalid(serialize([](GgufWriter& w) { w.AddString("general.alignment", "32"); }),
                "general.alignment");
}

TEST(GgufFileTest, RejectsBadTensorInfos) {
  auto one_tensor = [](std::vector<int64_t> dims, GgmlType type, std::vector<uint8_t> data) {
    GgufWriter w;
    w.AddTensor("t", std::move(dims), type, std::move(data));
    return *w.Serialize();
  };
  const std::string good = one_tensor({8}, GgmlType::kF32, std::vector<uint8_t>(32));
  ExpectInvalid(one_tensor({8}, static_cast<GgmlType>(77), std::vector<uint8_t>(32)),
                "unknown type 77");
  ExpectInvalid(one_tensor({1, 1, 1, 1, 8}, GgmlType::kF32, std::vector<uint8_t>(32)),
                "5 dimensions");
  std::string short_rows = one_tensor({32, 2}, GgmlType::kQ8_0, std::vector<uint8_t>(68));
  Patch<int64_t>(short_rows, short_rows.find('t') + 1 + 4, 16);
  Patch<int64_t>(short_rows, short_rows.find('t') + 1 + 4 + 8, 4);
  ExpectInvalid(short_rows, "rows of 16 elements, not a multiple of the Q8_0 block of 32");

  std::string negative = good;
  Patch<int64_t>(negative, good.find('t') + 1 + 4, -8);
  ExpectInvalid(negative, "dimension 0 = -8");
  GgufWriter huge;
  huge.AddTensor("t", {1ll << 40, 1ll << 40}, static_cast<GgmlType>(77), std::vector<uint8_t>());
  ExpectInvalid(*huge.Serialize(), "more elements than fit");

  std::string misaligned = good;
  Patch<uint64_t>(misaligned, OffsetFieldOf(good, "t", 1), 4);
  ExpectInvalid(misaligned, "offset 4, not a multiple of the alignment 32");
  std::string beyond = good;
  Patch<uint64_t>(beyond, OffsetFieldOf(good, "t", 1), uint64_t{1} << 63);
  ExpectInvalid(beyond, "truncated: tensor 't'");
  ExpectInvalid(good + std::string(32, '\0'), "32 unexpected bytes");

  GgufWriter dup;
  dup.AddTensor("t", {8}, GgmlType::kF32, std::vector<uint8_t>(32));
  dup.AddTensor("t", {8}, GgmlType::kF32, std::vector<uint8_t>(32));
  ExpectInvalid(*dup.Serialize(), "repeats tensor 't'");
}

TEST(GgufFileTest, MissingFileIsNotFound) {
  EXPECT_THAT(GgufFile::Open(::tandem::testing::TempDir() + "/absent.gguf").status(),
              StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace tandem
