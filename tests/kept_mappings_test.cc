// io/mapped_file.h, KeptMappings: a file mapped once is found again by its
// inode (under another name too), at its size only; a deleted file's
// mapping is let go, a holder's copy stays valid; at most `keep` are kept;
// bytes written through a mapping are the file's.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "io/mapped_file.h"

namespace mhckpt::io {
namespace {

using Mode = KeptMappings::Mode;

class KeptMappingsTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("mhckpt-kept-mappings-test-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  [[nodiscard]] std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  static std::string Contents(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  std::filesystem::path dir_;
};

TEST_F(KeptMappingsTest, MapsAFileOnceAndFindsItAgainUnderAnotherName) {
  KeptMappings maps(4);
  bool created = false;
  auto a = maps.Map(Path("w0.bin"), 8192, Mode::kCreate, &created);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_TRUE(created);
  ASSERT_NE((*a)->data, nullptr);
  EXPECT_EQ((*a)->size, 8192U);
  std::memset((*a)->data, 'x', 8192);
  EXPECT_EQ(Contents(Path("w0.bin")), std::string(8192, 'x'));

  auto again = maps.Map(Path("w0.bin"), 8192, Mode::kCreate, &created);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_FALSE(created);
  EXPECT_EQ(again->get(), a->get());  // the same mapping, not mapped anew

  // A recycled step directory: the file under a new name is the same inode.
  std::filesystem::rename(Path("w0.bin"), Path("w1.bin"));
  auto renamed = maps.Map(Path("w1.bin"), 8192, Mode::kWarmOnly);
  ASSERT_TRUE(renamed.ok()) << renamed.status().ToString();
  EXPECT_EQ(renamed->get(), a->get());
  EXPECT_EQ(maps.size(), 1U);
}

TEST_F(KeptMappingsTest, AnotherSizeMapsAnewAndDropsTheStaleMapping) {
  KeptMappings maps(4);
  auto a = maps.Map(Path("f.bin"), 4096, Mode::kCreate);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(maps.Map(Path("f.bin"), 12288, Mode::kWarmOnly).status().code(), StatusCode::kNotFound);
  bool created = true;
  auto b = maps.Map(Path("f.bin"), 12288, Mode::kCreate, &created);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_FALSE(created);
  EXPECT_EQ((*b)->size, 12288U);
  EXPECT_EQ(std::filesystem::file_size(Path("f.bin")), 12288U);
  EXPECT_EQ(maps.size(), 1U);
  std::memset((*b)->data, 'y', 12288);
  EXPECT_EQ(Contents(Path("f.bin")), std::string(12288, 'y'));
}

TEST_F(KeptMappingsTest, MissingFilesAndColdFilesAreNotFound) {
  KeptMappings maps(4);
  EXPECT_EQ(maps.Map(Path("none.bin"), 4096, Mode::kWarmOnly).status().code(),
            StatusCode::kNotFound);
  EXPECT_FALSE(std::filesystem::exists(Path("none.bin")));
  std::ofstream(Path("cold.bin")).put('c');
  const Status cold = maps.Map(Path("cold.bin"), 1, Mode::kWarmOnly).status();
  EXPECT_EQ(cold.code(), StatusCode::kNotFound);
  EXPECT_NE(cold.message().find("cold.bin"), std::string::npos) << cold.ToString();
  const Status nodir = maps.Map(Path("no/such/dir.bin"), 4096, Mode::kCreate).status();
  EXPECT_FALSE(nodir.ok());
  EXPECT_NE(nodir.message().find("no/such/dir.bin"), std::string::npos) << nodir.ToString();
  EXPECT_EQ(maps.size(), 0U);
}

TEST_F(KeptMappingsTest, DeletedFilesAreLetGoAndAHolderKeepsItsCopy) {
  KeptMappings maps(4);
  auto a = maps.Map(Path("gone.bin"), 4096, Mode::kCreate);
  auto b = maps.Map(Path("stays.bin"), 4096, Mode::kCreate);
  ASSERT_TRUE(a.ok() && b.ok());
  std::shared_ptr<KeptMappings::Mapping> held = *a;
  std::filesystem::remove(Path("gone.bin"));
  EXPECT_TRUE(held->Deleted());
  EXPECT_FALSE((*b)->Deleted());
  maps.ForgetDeleted();
  EXPECT_EQ(maps.size(), 1U);
  std::memset(held->data, 'z', 4096);  // still mapped for its holder
  // A new file at the old name is another inode: mapped anew.
  bool created = false;
  auto fresh = maps.Map(Path("gone.bin"), 4096, Mode::kCreate, &created);
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  EXPECT_TRUE(created);
  EXPECT_NE((*fresh)->ino, held->ino);
  EXPECT_EQ(maps.size(), 2U);
}

TEST_F(KeptMappingsTest, KeepsAtMostItsCountOldestGoingFirst) {
  KeptMappings maps(2);
  std::vector<std::shared_ptr<KeptMappings::Mapping>> mapped;
  for (const char* name : {"a.bin", "b.bin", "c.bin"}) {
    auto m = maps.Map(Path(name), 4096, Mode::kCreate);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    mapped.push_back(*m);
  }
  EXPECT_EQ(maps.size(), 2U);
  EXPECT_EQ(maps.Map(Path("a.bin"), 4096, Mode::kWarmOnly).status().code(), StatusCode::kNotFound);
  auto c = maps.Map(Path("c.bin"), 4096, Mode::kWarmOnly);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->get(), mapped[2].get());
}

TEST_F(KeptMappingsTest, EmptyFilesMapToNothing) {
  KeptMappings maps(2);
  auto e = maps.Map(Path("empty.bin"), 0, Mode::kCreate);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ((*e)->data, nullptr);
  EXPECT_EQ((*e)->size, 0U);
  EXPECT_EQ(std::filesystem::file_size(Path("empty.bin")), 0U);
}

}  // namespace
}  // namespace mhckpt::io
