#include "common/base/mapped_file.h"

#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "tests/testing/model_files.h"
#include "tests/testing/status_matchers.h"

namespace tandem {
namespace {

using ::tandem::testing::StatusIs;
using ::testing::HasSubstr;

TEST(MappedFile, MapsBytes) {
  const std::string path = ::tandem::testing::TempDir() + "/bytes";
  std::ofstream(path, std::ios::binary) << "hello";
  ASSERT_OK_AND_ASSIGN(MappedFile f, MappedFile::Open(path));
  ASSERT_EQ(f.size(), 5u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(f.bytes().data()), 5), "hello");
  MappedFile moved = std::move(f);
  EXPECT_EQ(moved.size(), 5u);
  EXPECT_EQ(f.size(), 0u);
}

TEST(MappedFile, MissingFileNamesPath) {
  EXPECT_THAT(MappedFile::Open("/nonexistent/tandem.bin"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent/tandem.bin")));
}

TEST(MappedFile, DirectoryIsRejected) {
  EXPECT_THAT(MappedFile::Open("/tmp"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a regular file")));
}

}  // namespace
}  // namespace tandem
