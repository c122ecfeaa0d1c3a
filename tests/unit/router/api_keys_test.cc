#include "router/api_keys.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tandem::router {
namespace {

using ::tandem::testing::StatusIs;
using ::testing::HasSubstr;

TEST(ApiKeysTest, NoKeysLetsEverythingIn) {
  absl::StatusOr<ApiKeys> keys = ApiKeys::Create({}, "");
  ASSERT_TRUE(keys.ok());
  EXPECT_FALSE(keys->enabled());
}

TEST(ApiKeysTest, ChecksBearerKeysFromListAndFile) {
  const std::string path = ::testing::TempDir() + "/api_keys_test_keys.txt";
  {
    std::ofstream f(path);
    f << "# the team's keys\n\n  file-key-1  \nfile-key-2\n";
  }
  absl::StatusOr<ApiKeys> keys = ApiKeys::Create({"flag-key"}, path);
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_TRUE(keys->enabled());
  EXPECT_EQ(keys->size(), 3u);
  EXPECT_TRUE(keys->Check("flag-key"));
  EXPECT_TRUE(keys->Check("file-key-1"));
  EXPECT_TRUE(keys->CheckAuthorization("Bearer file-key-2"));
  EXPECT_TRUE(keys->CheckAuthorization("bearer  flag-key "));
  EXPECT_FALSE(keys->Check("file-key"));    // a prefix
  EXPECT_FALSE(keys->Check("flag-key-1"));  // longer
  EXPECT_FALSE(keys->Check("# the team's keys"));
  EXPECT_FALSE(keys->Check(""));
  EXPECT_FALSE(keys->CheckAuthorization("flag-key"));  // no scheme
  EXPECT_FALSE(keys->CheckAuthorization("Basic flag-key"));
  EXPECT_FALSE(keys->CheckAuthorization("Bearer "));
  EXPECT_FALSE(keys->CheckAuthorization(""));
  std::remove(path.c_str());
}

TEST(ApiKeysTest, BadKeysAreRefused) {
  EXPECT_THAT(ApiKeys::Create({""}, ""), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ApiKeys::Create({"a b"}, ""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("space")));
  EXPECT_THAT(ApiKeys::Create({std::string(kMaxApiKeyBytes + 1, 'k')}, ""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("longer")));
  EXPECT_THAT(ApiKeys::Create({}, "/nonexistent/keys"), StatusIs(absl::StatusCode::kNotFound));
  const std::string path = ::testing::TempDir() + "/api_keys_test_empty.txt";
  {
    std::ofstream f(path);
    f << "# nothing\n";
  }
  EXPECT_THAT(ApiKeys::Create({}, path),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no key")));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace tandem::router
