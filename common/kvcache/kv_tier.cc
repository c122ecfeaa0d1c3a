#include "common/kvcache/kv_tier.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/xxhash_dispatch.h"

namespace tandem {
namespace {

constexpr char kMagic[8] = {'T', 'N', 'D', 'M', 'K', 'V', 'B', '1'};
constexpr uint32_t kVersion = 1;

// Little-endian fields at fixed offsets (the layout below), as every
// machine this runs on stores them.
class Writer {
 public:
  explicit Writer(uint8_t* out) : out_(out) {}
  template <typename T>
  void Put(T value) {
    std::memcpy(out_ + at_, &value, sizeof(T));
    at_ += sizeof(T);
  }
  void Bytes(const void* data, size_t n) {
    std::memcpy(out_ + at_, data, n);
    at_ += n;
  }

 private:
  uint8_t* out_;
  size_t at_ = 0;
};

class Reader {
 public:
  explicit Reader(const uint8_t* in) : in_(in) {}
  template <typename T>
  T Get() {
    T value;
    std::memcpy(&value, in_ + at_, sizeof(T));
    at_ += sizeof(T);
    return value;
  }

 private:
  const uint8_t* in_;
  size_t at_ = 0;
};

}  // namespace

KvTierIdentity KvTierIdentity::Of(const BlockHash& salt, const KvLayout& layout) {
  return {.salt = salt,
          .n_layers = layout.n_layers,
          .block_size = layout.block_size,
          .kv_dim = layout.kv_dim,
          .kv_heads = layout.kv_heads,
          .dtype = layout.dtype,
          .latent = layout.latent};
}

size_t KvTierIdentity::payload_bytes() const {
  KvLayout layout;
  layout.n_layers = n_layers;
  layout.num_blocks = 1;
  layout.block_size = block_size;
  layout.kv_dim = kv_dim;
  layout.kv_heads = kv_heads;
  layout.dtype = dtype;
  layout.latent = latent;
  return layout.block_bytes() * static_cast<size_t>(n_layers);
}

std::string_view TierMissName(TierMiss miss) {
  switch (miss) {
    case TierMiss::kAbsent:
      return "absent";
    case TierMiss::kCorrupt:
      return "corrupt";
    case TierMiss::kTruncated:
      return "truncated";
    case TierMiss::kForeign:
      return "foreign";
    case TierMiss::kIoError:
      return "io_error";
    case TierMiss::kCancelled:
      return "cancelled";
  }
  return "unknown";
}

uint64_t TierChecksum(std::span<const uint8_t> payload) {
  return XXH3_64bits(payload.data(), payload.size());
}

// Layout: magic (8), version (4), dtype (4), salt (16), hash (16),
// n_layers, block_size, kv_dim, kv_heads (4 each), payload bytes (8),
// payload checksum (8), latent (4: 0 for keys and values, as records from
// before latent layouts have it), zero padding, header checksum (last 8).
std::array<uint8_t, TierRecordHeader::kBytes> EncodeTierHeader(const TierRecordHeader& header) {
  std::array<uint8_t, TierRecordHeader::kBytes> out{};
  Writer w(out.data());
  w.Bytes(kMagic, sizeof(kMagic));
  w.Put<uint32_t>(kVersion);
  w.Put<uint32_t>(static_cast<uint32_t>(header.identity.dtype));
  w.Put<uint64_t>(header.identity.salt.high);
  w.Put<uint64_t>(header.identity.salt.low);
  w.Put<uint64_t>(header.hash.high);
  w.Put<uint64_t>(header.hash.low);
  w.Put<int32_t>(header.identity.n_layers);
  w.Put<int32_t>(header.identity.block_size);
  w.Put<int32_t>(header.identity.kv_dim);
  w.Put<int32_t>(header.identity.kv_heads);
  w.Put<uint64_t>(header.payload_bytes);
  w.Put<uint64_t>(header.payload_checksum);
  w.Put<uint32_t>(header.identity.latent ? 1 : 0);
  const uint64_t own = XXH3_64bits(out.data(), out.size() - 8);
  std::memcpy(out.data() + out.size() - 8, &own, 8);
  return out;
}

absl::StatusOr<TierRecordHeader> DecodeTierHeader(std::span<const uint8_t> bytes) {
  if (bytes.size() < TierRecordHeader::kBytes) {
    return absl::OutOfRangeError(absl::StrCat("a KV tier record header is ",
                                              TierRecordHeader::kBytes, " bytes; ", bytes.size(),
                                              " were read"));
  }
  uint64_t own;
  std::memcpy(&own, bytes.data() + TierRecordHeader::kBytes - 8, 8);
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0 ||
      own != XXH3_64bits(bytes.data(), TierRecordHeader::kBytes - 8)) {
    return absl::DataLossError("not a KV tier record, or its header's checksum does not match");
  }
  Reader r(bytes.data() + sizeof(kMagic));
  if (const uint32_t version = r.Get<uint32_t>(); version != kVersion) {
    return absl::DataLossError(
        absl::StrCat("KV tier record version ", version, "; this build reads ", kVersion));
  }
  TierRecordHeader h;
  h.identity.dtype = static_cast<DType>(r.Get<uint32_t>());
  h.identity.salt.high = r.Get<uint64_t>();
  h.identity.salt.low = r.Get<uint64_t>();
  h.hash.high = r.Get<uint64_t>();
  h.hash.low = r.Get<uint64_t>();
  h.identity.n_layers = r.Get<int32_t>();
  h.identity.block_size = r.Get<int32_t>();
  h.identity.kv_dim = r.Get<int32_t>();
  h.identity.kv_heads = r.Get<int32_t>();
  h.payload_bytes = r.Get<uint64_t>();
  h.payload_checksum = r.Get<uint64_t>();
  const uint32_t latent = r.Get<uint32_t>();
  if (latent > 1) return absl::DataLossError(absl::StrCat("KV tier record latent flag ", latent));
  h.identity.latent = latent == 1;
  return h;
}

}  // namespace tandem
