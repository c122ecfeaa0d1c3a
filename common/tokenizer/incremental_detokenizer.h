// Token ids -> text for streaming: pieces are decoded with the previous
// token as context and only whole UTF-8 characters are handed out, so a
// character spread over several byte-fallback tokens (<0xE4><0xBD><0xA0>) is
// never sent half.
#ifndef TANDEM_COMMON_TOKENIZER_INCREMENTAL_DETOKENIZER_H_
#define TANDEM_COMMON_TOKENIZER_INCREMENTAL_DETOKENIZER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem {

// Everything handed out is valid UTF-8: malformed bytes are replaced by
// U+FFFD, one per maximal ill-formed subpart (the Unicode recommendation, as
// Python's errors="replace" does), because streamed text ends up in protobuf
// strings, which must be UTF-8. For a decode that is valid UTF-8, the
// concatenation of every Push result and Flush is exactly the concatenation
// of Tokenizer::Decode over the ids.
//
// Thread-compatible. `tokenizer` must outlive this object.
class IncrementalDetokenizer {
 public:
  // For ids that follow BOS: the first piece loses its leading space.
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer);
  // For ids that follow token `prev`, e.g. the last token of a prompt; any
  // id that is not BOS (such as -1) keeps the first piece's leading space.
  IncrementalDetokenizer(const Tokenizer& tokenizer, int32_t prev);

  // Appends token `id` and returns the characters it completes, possibly
  // none. An out-of-range id is INVALID_ARGUMENT and changes nothing.
  absl::StatusOr<std::string> Push(int32_t id);

  // Returns the bytes still held back (the start of a character no token
  // completed) as U+FFFD, and empties the buffer. Later pushes continue the
  // same sequence.
  std::string Flush();

 private:
  // Takes the longest prefix of pending_ that is whole characters; when
  // `at_end`, a cut-off character at the end is taken too, as U+FFFD.
  std::string TakeComplete(bool at_end);

  const Tokenizer& tokenizer_;
  int32_t prev_;
  std::string pending_;  // Undelivered bytes: at most 3, an incomplete character.
};

}  // namespace tandem

#endif  // TANDEM_COMMON_TOKENIZER_INCREMENTAL_DETOKENIZER_H_
