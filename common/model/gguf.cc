#include "common/model/gguf.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <optional>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/mapped_file.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

static_assert(std::endian::native == std::endian::little,
              "GGUF values are read by copying little-endian bytes");

constexpr uint32_t kMaxDims = 4;  // GGML_MAX_DIMS
// Smallest encodings, used to cap counts by the bytes left before reserving:
// a metadata entry is a key length, a type and a one-byte value; a tensor
// info is a name length, a dimension count, a type and an offset.
constexpr uint64_t kMinEntryBytes = 8 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;

// Names and encoded sizes of the value types, indexed by their number
// (0 bytes: variable size).
constexpr struct {
  const char* name;
  uint64_t size;
} kValueTypes[] = {
    {"uint8", 1},  {"int8", 1},    {"uint16", 2},  {"int16", 2},  {"uint32", 4},
    {"int32", 4},  {"float32", 4}, {"bool", 1},    {"string", 0}, {"array", 0},
    {"uint64", 8}, {"int64", 8},   {"float64", 8},
};

// Debian's Abseil has its own string_view, which StrCat takes but
// std::string_view does not convert to.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// An integer metadata value of any width and signedness.
struct Integer {
  bool negative;
  uint64_t magnitude;
};

bool IsInteger(GgufValueType t) {
  return t != GgufValueType::kBool && t != GgufValueType::kFloat32 &&
         t != GgufValueType::kFloat64 && GgufScalarSize(t) != 0;
}

std::optional<Integer> DecodeInteger(GgufValueType type, const uint8_t* p) {
  auto signed_value = [](int64_t v) {
    return Integer{v < 0,
                   v < 0 ? uint64_t{0} - static_cast<uint64_t>(v) : static_cast<uint64_t>(v)};
  };
  switch (type) {
    case GgufValueType::kUint8:
      return Integer{false, Load<uint8_t>(p)};
    case GgufValueType::kUint16:
      return Integer{false, Load<uint16_t>(p)};
    case GgufValueType::kUint32:
      return Integer{false, Load<uint32_t>(p)};
    case GgufValueType::kUint64:
      return Integer{false, Load<uint64_t>(p)};
    case GgufValueType::kInt8:
      return signed_value(Load<int8_t>(p));
    case GgufValueType::kInt16:
      return signed_value(Load<int16_t>(p));
    case GgufValueType::kInt32:
      return signed_value(Load<int32_t>(p));
    case GgufValueType::kInt64:
      return signed_value(Load<int64_t>(p));
    default:
      return std::nullopt;
  }
}

template <typename T>
std::optional<T> Narrow(Integer v) {
  constexpr uint64_t kMax = static_cast<uint64_t>(std::numeric_limits<T>::max());
  if (!v.negative) {
    if (v.magnitude > kMax) return std::nullopt;
    return static_cast<T>(v.magnitude);
  }
  if constexpr (std::is_unsigned_v<T>) {
    return std::nullopt;
  } else {
    if (v.magnitude > kMax + 1) return std::nullopt;
    return static_cast<T>(-static_cast<int64_t>(v.magnitude - 1) - 1);
  }
}

std::string ToString(Integer v) { return absl::StrCat(v.negative ? "-" : "", v.magnitude); }

std::optional<double> DecodeFloat(GgufValueType type, const uint8_t* p) {
  if (type == GgufValueType::kFloat32) return Load<float>(p);
  if (type == GgufValueType::kFloat64) return Load<double>(p);
  return std::nullopt;
}

// Converting a finite double beyond the float range is undefined behaviour.
bool FitsInFloat(double d) {
  return !std::isfinite(d) || std::fabs(d) <= std::numeric_limits<float>::max();
}

std::string TypeDescription(const GgufValue& v) {
  if (v.type != GgufValueType::kArray) return GgufValueTypeName(v.type);
  return absl::StrCat("array of ", GgufValueTypeName(v.element_type));
}

}  // namespace

const char* GgufValueTypeName(GgufValueType type) {
  const auto i = static_cast<uint32_t>(type);
  return i < std::size(kValueTypes) ? kValueTypes[i].name : "unknown";
}

uint64_t GgufScalarSize(GgufValueType type) {
  const auto i = static_cast<uint32_t>(type);
  return i < std::size(kValueTypes) ? kValueTypes[i].size : 0;
}

class GgufFile::Parser {
 public:
  explicit Parser(GgufFile& out) : out_(out), bytes_(out.bytes_) {}

  absl::Status Parse() {
    if (bytes_.size() < 4 || std::memcmp(bytes_.data(), "GGUF", 4) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", out_.path(), "' is not a GGUF file: it does not start with the magic 'GGUF'"));
    }
    pos_ = 4;
    uint32_t version = 0;
    uint64_t tensor_count = 0, entry_count = 0;
    if (!Read(&version)) return Truncated("the version", 4);
    if (version != 2 && version != 3) {
      const uint32_t swapped = __builtin_bswap32(version);
      if (swapped == 2 || swapped == 3) {
        return Invalid("is a big-endian GGUF file; only little-endian files are supported");
      }
      return Invalid(
          absl::StrCat("has GGUF version ", version, "; only versions 2 and 3 are supported"));
    }
    out_.version_ = version;
    if (!Read(&tensor_count)) return Truncated("the tensor count", 8);
    if (!Read(&entry_count)) return Truncated("the metadata count", 8);

    if (entry_count > Remaining() / kMinEntryBytes) {
      return Invalid(absl::StrCat("is truncated or corrupt: it claims ", entry_count,
                                  " metadata entries but only ", Remaining(),
                                  " bytes follow the header"));
    }
    out_.metadata_.reserve(entry_count);
    for (uint64_t i = 0; i < entry_count; ++i) RETURN_IF_ERROR(ParseEntry(i));
    RETURN_IF_ERROR(ParseAlignment());

    if (tensor_count > Remaining() / kMinTensorInfoBytes) {
      return Invalid(absl::StrCat("is truncated or corrupt: it claims ", tensor_count,
                                  " tensors but only ", Remaining(), " bytes follow the metadata"));
    }
    out_.tensors_.reserve(tensor_count);
    for (uint64_t i = 0; i < tensor_count; ++i) RETURN_IF_ERROR(ParseTensorInfo(i));
    return PlaceTensorData();
  }

 private:
  absl::Status Invalid(std::string_view problem) const { return out_.Error(problem); }
  absl::Status Truncated(std::string_view what, uint64_t need) const {
    return Invalid(absl::StrCat("is truncated: ", Sv(what), " needs ", need, " bytes at offset ",
                                pos_, " but the file has ", bytes_.size(), " bytes"));
  }

  uint64_t Remaining() const { return bytes_.size() - pos_; }

  bool Take(uint64_t n, std::span<const uint8_t>* out) {
    if (n > Remaining()) return false;
    *out = bytes_.subspan(pos_, n);
    pos_ += n;
    return true;
  }
  template <typename T>
  bool Read(T* v) {
    if (sizeof(T) > Remaining()) return false;
    *v = Load<T>(bytes_.data() + pos_);
    pos_ += sizeof(T);
    return true;
  }
  absl::Status ReadString(std::string_view what, std::span<const uint8_t>* chars) {
    uint64_t length = 0;
    if (!Read(&length)) return Truncated(absl::StrCat("the length of ", Sv(what)), 8);
    if (!Take(length, chars)) return Truncated(what, length);
    return absl::OkStatus();
  }

  absl::Status ParseEntry(uint64_t index) {
    std::span<const uint8_t> key_chars;
    RETURN_IF_ERROR(ReadString(absl::StrCat("metadata key #", index), &key_chars));
    GgufMetadataEntry entry;
    entry.key.assign(key_chars.begin(), key_chars.end());
    if (out_.key_index_.count(entry.key) != 0) {
      return Invalid(absl::StrCat("repeats metadata key '", entry.key, "'"));
    }
    uint32_t type = 0;
    if (!Read(&type)) return Truncated(absl::StrCat("the type of metadata '", entry.key, "'"), 4);
    RETURN_IF_ERROR(ParseValue(entry.key, static_cast<GgufValueType>(type), &entry.value));
    out_.key_index_.emplace(entry.key, out_.metadata_.size());
    out_.metadata_.push_back(std::move(entry));
    return absl::OkStatus();
  }

  absl::Status ParseValue(const std::string& key, GgufValueType type, GgufValue* value) {
    value->type = type;
    if (type == GgufValueType::kString) {
      return ReadString(absl::StrCat("the value of '", Sv(key), "'"), &value->bytes);
    }
    if (type != GgufValueType::kArray) {
      const uint64_t size = GgufScalarSize(type);
      if (size == 0) {
        return Invalid(absl::StrCat("metadata '", Sv(key), "' has unknown value type ",
                                    static_cast<uint32_t>(type)));
      }
      if (!Take(size, &value->bytes))
        return Truncated(absl::StrCat("the value of '", Sv(key), "'"), size);
      return absl::OkStatus();
    }
    uint32_t element_type = 0;
    if (!Read(&element_type))
      return Truncated(absl::StrCat("the element type of '", Sv(key), "'"), 4);
    value->element_type = static_cast<GgufValueType>(element_type);
    if (!Read(&value->count))
      return Truncated(absl::StrCat("the length of array '", Sv(key), "'"), 8);
    const uint64_t element_size = GgufScalarSize(value->element_type);
    if (value->element_type == GgufValueType::kArray) {
      return Invalid(
          absl::StrCat("metadata '", Sv(key), "' is an array of arrays, which is not supported"));
    }
    if (value->element_type != GgufValueType::kString && element_size == 0) {
      return Invalid(absl::StrCat("array '", Sv(key), "' has unknown element type ", element_type));
    }
    // Strings take at least their 8-byte length each.
    const uint64_t min_size = element_size != 0 ? element_size : 8;
    if (value->count > Remaining() / min_size) {
      return Invalid(absl::StrCat("is truncated or corrupt: array '", Sv(key), "' claims ",
                                  value->count, " elements of type ",
                                  GgufValueTypeName(value->element_type), " but only ", Remaining(),
                                  " bytes remain"));
    }
    const uint64_t elements_start = pos_;
    std::span<const uint8_t> ignored;
    if (element_size != 0) {
      Take(value->count * element_size, &ignored);
    } else {
      for (uint64_t i = 0; i < value->count; ++i) {
        RETURN_IF_ERROR(
            ReadString(absl::StrCat("string #", i, " of array '", Sv(key), "'"), &ignored));
      }
    }
    value->bytes = bytes_.subspan(elements_start, pos_ - elements_start);
    return absl::OkStatus();
  }

  absl::Status ParseAlignment() {
    if (!out_.HasKey("general.alignment")) return absl::OkStatus();
    ASSIGN_OR_RETURN(uint32_t alignment, out_.GetUint32("general.alignment"));
    if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
      return Invalid(
          absl::StrCat("has general.alignment ", alignment, "; it must be a power of two"));
    }
    out_.alignment_ = alignment;
    return absl::OkStatus();
  }

  absl::Status ParseTensorInfo(uint64_t index) {
    GgufTensorInfo t;
    std::span<const uint8_t> name;
    RETURN_IF_ERROR(ReadString(absl::StrCat("the name of tensor #", index), &name));
    t.name.assign(name.begin(), name.end());
    if (out_.tensor_index_.count(t.name) != 0) {
      return Invalid(absl::StrCat("repeats tensor '", t.name, "'"));
    }
    const std::string what = absl::StrCat("the info of tensor '", t.name, "'");
    uint32_t n_dims = 0;
    if (!Read(&n_dims)) return Truncated(what, 4);
    if (n_dims > kMaxDims) {
      return Invalid(absl::StrCat("tensor '", t.name, "' has ", n_dims, " dimensions; at most ",
                                  kMaxDims, " are allowed"));
    }
    t.num_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t extent = 0;
      if (!Read(&extent)) return Truncated(what, 8);
      if (extent > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return Invalid(absl::StrCat("tensor '", t.name, "' has dimension ", d, " = ",
                                    static_cast<int64_t>(extent), ", which is negative"));
      }
      const int64_t e = static_cast<int64_t>(extent);
      if (e != 0 && t.num_elements > std::numeric_limits<int64_t>::max() / e) {
        return Invalid(absl::StrCat("tensor '", t.name, "' has more elements than fit in int64"));
      }
      t.num_elements *= e;
      t.dims.push_back(e);
    }
    uint32_t type = 0;
    if (!Read(&type)) return Truncated(what, 4);
    if (!Read(&t.offset)) return Truncated(what, 8);
    t.type = static_cast<GgmlType>(type);
    const std::optional<GgmlTypeTraits> traits = GgmlTypeTraitsOf(t.type);
    if (!traits) return Invalid(absl::StrCat("tensor '", t.name, "' has unknown type ", type));
    const int64_t row = t.dims.empty() ? 1 : t.dims[0];
    if (row % traits->block_elements != 0) {
      return Invalid(absl::StrCat("tensor '", t.name, "' has rows of ", row,
                                  " elements, not a multiple of the ", traits->name, " block of ",
                                  traits->block_elements));
    }
    const uint64_t blocks = static_cast<uint64_t>(t.num_elements / traits->block_elements);
    if (blocks > std::numeric_limits<uint64_t>::max() / traits->block_bytes) {
      return Invalid(absl::StrCat("tensor '", t.name, "' has more bytes than fit in uint64"));
    }
    t.num_bytes = blocks * traits->block_bytes;
    out_.tensor_index_.emplace(t.name, out_.tensors_.size());
    out_.tensors_.push_back(std::move(t));
    return absl::OkStatus();
  }

  // The data section starts at the first aligned offset after the tensor
  // infos; writers pad each tensor to the alignment, the last one included,
  // so anything past the padded end is not part of a valid file.
  absl::Status PlaceTensorData() {
    const uint64_t alignment = out_.alignment_;
    const uint64_t data_start = AlignUp(pos_, alignment);
    if (out_.tensors_.empty()) {
      if (bytes_.size() > data_start) {
        return Invalid(absl::StrCat("has no tensors but ", bytes_.size() - pos_,
                                    " unexpected bytes after its metadata"));
      }
      return absl::OkStatus();
    }
    if (data_start > bytes_.size()) {
      return Invalid(absl::StrCat("is truncated: its tensor data should start at offset ",
                                  data_start, " but the file has ", bytes_.size(), " bytes"));
    }
    const uint64_t data_size = bytes_.size() - data_start;
    uint64_t end = 0;
    for (GgufTensorInfo& t : out_.tensors_) {
      if (t.offset % alignment != 0) {
        return Invalid(absl::StrCat("tensor '", t.name, "' has offset ", t.offset,
                                    ", not a multiple of the alignment ", alignment));
      }
      if (t.offset > data_size || t.num_bytes > data_size - t.offset) {
        return Invalid(absl::StrCat("is truncated: tensor '", t.name, "' (", GgmlTypeName(t.type),
                                    " [", absl::StrJoin(t.dims, ", "), "]) needs ", t.num_bytes,
                                    " bytes at offset ", data_start + t.offset,
                                    " but the file has ", bytes_.size(), " bytes"));
      }
      t.data = bytes_.subspan(data_start + t.offset, t.num_bytes);
      end = std::max(end, t.offset + t.num_bytes);
    }
    const uint64_t padded_end = data_start + AlignUp(end, alignment);
    if (bytes_.size() > padded_end) {
      return Invalid(absl::StrCat("has ", bytes_.size() - padded_end,
                                  " unexpected bytes after the end of its tensor data (offset ",
                                  padded_end, ")"));
    }
    return absl::OkStatus();
  }

  GgufFile& out_;
  std::span<const uint8_t> bytes_;
  uint64_t pos_ = 0;
};

absl::StatusOr<GgufFile> GgufFile::Open(const std::string& path) {
  ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::Open(path));
  auto shared = std::make_shared<const MappedFile>(std::move(mapped));
  const std::span<const uint8_t> bytes = shared->bytes();
  return Parse(std::move(shared), bytes, path);
}

absl::StatusOr<GgufFile> GgufFile::Parse(std::shared_ptr<const void> storage,
                                         std::span<const uint8_t> bytes, std::string path) {
  GgufFile file;
  file.path_ = std::move(path);
  file.storage_ = std::move(storage);
  file.bytes_ = bytes;
  RETURN_IF_ERROR(Parser(file).Parse());
  return file;
}

const GgufValue* GgufFile::FindValue(std::string_view key) const {
  auto it = key_index_.find(key);
  return it == key_index_.end() ? nullptr : &metadata_[it->second].value;
}

const GgufTensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

absl::StatusOr<const GgufValue*> GgufFile::Lookup(std::string_view key) const {
  const GgufValue* v = FindValue(key);
  if (v == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("GGUF file '", path(), "' has no metadata '", Sv(key), "'"));
  }
  return v;
}

absl::Status GgufFile::Error(std::string_view problem) const {
  return absl::InvalidArgumentError(absl::StrCat("GGUF file '", path(), "' ", Sv(problem)));
}

absl::Status GgufFile::WrongType(std::string_view key, const GgufValue& value,
                                 std::string_view wanted) const {
  return Error(
      absl::StrCat("metadata '", Sv(key), "' is a ", TypeDescription(value), ", not ", Sv(wanted)));
}

template <typename T>
absl::StatusOr<T> GgufFile::GetInteger(std::string_view key, const char* wanted) const {
  ASSIGN_OR_RETURN(const GgufValue* v, Lookup(key));
  if (v->type == GgufValueType::kArray || !IsInteger(v->type)) return WrongType(key, *v, wanted);
  const Integer i = *DecodeInteger(v->type, v->bytes.data());
  const std::optional<T> narrowed = Narrow<T>(i);
  if (!narrowed) {
    return Error(
        absl::StrCat("metadata '", Sv(key), "' is ", ToString(i), ", out of range for ", wanted));
  }
  return *narrowed;
}

absl::StatusOr<uint32_t> GgufFile::GetUint32(std::string_view key) const {
  return GetInteger<uint32_t>(key, "a uint32");
}

absl::StatusOr<int32_t> GgufFile::GetInt32(std::string_view key) const {
  return GetInteger<int32_t>(key, "an int32");
}

absl::StatusOr<uint64_t> GgufFile::GetUint64(std::string_view key) const {
  return GetInteger<uint64_t>(key, "a uint64");
}

absl::StatusOr<float> GgufFile::GetFloat(std::string_view key) const {
  ASSIGN_OR_RETURN(const GgufValue* v, Lookup(key));
  std::optional<double> f;
  if (v->type != GgufValueType::kArray) f = DecodeFloat(v->type, v->bytes.data());
  if (!f) return WrongType(key, *v, "a float");
  if (!FitsInFloat(*f)) {
    return Error(absl::StrCat("metadata '", Sv(key), "' is ", *f, ", out of range for a float"));
  }
  return static_cast<float>(*f);
}

absl::StatusOr<bool> GgufFile::GetBool(std::string_view key) const {
  ASSIGN_OR_RETURN(const GgufValue* v, Lookup(key));
  if (v->type != GgufValueType::kBool) return WrongType(key, *v, "a bool");
  return v->bytes[0] != 0;
}

absl::StatusOr<std::string> GgufFile::GetString(std::string_view key) const {
  ASSIGN_OR_RETURN(const GgufValue* v, Lookup(key));
  if (v->type != GgufValueType::kString) return WrongType(key, *v, "a string");
  return std::string(v->bytes.begin(), v->bytes.end());
}

absl::StatusOr<std::vector<std::string>> GgufFile::GetStringArray(std::string_view key) const {
  ASSIGN_OR_RETURN(const GgufValue* v, Lookup(key));
  if (v->type != GgufValueType::kArray || v->element_type != GgufValueType::kString) {
    return WrongType(key, *v, "an array of string");
  }
  // The parser has walked these strings, so each length fits in the bytes.
  std::vector<std::string> out;
  out.reserve(v->count);
  const uint8_t* p = v->bytes.data();
  for (uint64_t i = 0; i < v->count; ++i) {
    const uint64_t length = Load<uint64_t>(p);
    out.emplace_back(reinterpret_cast<const char*>(p + 8), length);
    p += 8 + length;
  }
  return out;
}

absl::StatusOr<std::vector<float>> GgufFile::GetFloatArray(std::string_view key) const {
  ASSIGN_OR_RETURN(const GgufValue* v, Lookup(key));
  const bool float_elements =
      v->element_type == GgufValueType::kFloat32 || v->element_type == GgufValueType::kFloat64;
  if (v->type != GgufValueType::kArray || !float_elements) {
    return WrongType(key, *v, "an array of float");
  }
  const uint64_t size = GgufScalarSize(v->element_type);
  std::vector<float> out(v->count);
  for (uint64_t i = 0; i < v->count; ++i) {
    const double f = *DecodeFloat(v->element_type, v->bytes.data() + i * size);
    if (!FitsInFloat(f)) {
      return Error(absl::StrCat("array '", Sv(key), "' element ", i, " is ", f,
                                ", out of range for a float"));
    }
    out[i] = static_cast<float>(f);
  }
  return out;
}

absl::StatusOr<std::vector<int32_t>> GgufFile::GetInt32Array(std::string_view key) const {
  ASSIGN_OR_RETURN(const GgufValue* v, Lookup(key));
  if (v->type != GgufValueType::kArray || !IsInteger(v->element_type)) {
    return WrongType(key, *v, "an array of integers");
  }
  const uint64_t size = GgufScalarSize(v->element_type);
  std::vector<int32_t> out(v->count);
  for (uint64_t i = 0; i < v->count; ++i) {
    const Integer value = *DecodeInteger(v->element_type, v->bytes.data() + i * size);
    std::optional<int32_t> narrowed = Narrow<int32_t>(value);
    if (!narrowed) {
      return Error(absl::StrCat("array '", Sv(key), "' element ", i, " is ", ToString(value),
                                ", out of range for int32"));
    }
    out[i] = *narrowed;
  }
  return out;
}

}  // namespace tandem
