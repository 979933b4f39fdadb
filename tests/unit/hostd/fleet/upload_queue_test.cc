#include "upload_queue.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "s3_credentials.h"
#include "test_support.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;

UploadEntry Entry(const std::string& vm, const std::string& id, int64_t queued) {
  UploadEntry e;
  e.ref = {"host1", vm, id};
  e.prefix = "hvtrace";
  e.dir = "/var/lib/hvtrace/vms/" + vm + "/captures/" + id;
  e.queued_ns = queued;
  e.objects = {{"manifest.json", "hvtrace/host1/" + vm + "/" + id + "/manifest.json", false, true,
                "abc", ""},
               {"region.bin", "hvtrace/host1/" + vm + "/" + id + "/region.bin.zst", true, false, "",
                "upload-1"}};
  return e;
}

TEST(UploadQueue, SaveScanRemoveRoundTrip) {
  test_support::TempDir tmp("upload-queue");
  UploadQueueDir q(tmp.path() / "upload-queue");
  EXPECT_TRUE(q.Scan()->empty());  // No directory yet: nothing queued.
  ASSERT_TRUE(q.Save(Entry("b", "20261125T040001.000Z-panic", 2)).ok());
  ASSERT_TRUE(q.Save(Entry("a", "20261125T040000.000Z-manual", 1)).ok());
  EXPECT_TRUE(q.Pending("a", "20261125T040000.000Z-manual"));
  EXPECT_FALSE(q.Pending("a", "other"));
  // Only the entry: the temp file was renamed away.
  EXPECT_FALSE(fs::exists(q.EntryPath("a", "20261125T040000.000Z-manual").string() + ".tmp"));
  auto all = q.Scan();
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].ref.vm, "a");  // Oldest queued first.
  const UploadEntry b = (*all)[1];   // A copy: |all| is scanned again below.
  EXPECT_EQ(b.ref.host, "host1");
  ASSERT_EQ(b.objects.size(), 2u);
  EXPECT_TRUE(b.objects[0].done);
  EXPECT_EQ(b.objects[0].etag, "abc");
  EXPECT_TRUE(b.objects[1].compress);
  EXPECT_EQ(b.objects[1].upload_id, "upload-1");
  // Progress is saved in place.
  UploadEntry changed = b;
  changed.objects[1].done = true;
  changed.attempts = 3;
  changed.last_error = "HTTP 503";
  ASSERT_TRUE(q.Save(changed).ok());
  all = q.Scan();
  EXPECT_EQ((*all)[1].attempts, 3u);
  EXPECT_TRUE((*all)[1].objects[1].done);
  // A scratch file goes with its entry.
  const fs::path scratch = q.ScratchPath("b", b.ref.id, "region.bin.zst");
  std::ofstream(scratch) << "x";
  ASSERT_TRUE(q.Remove("b", b.ref.id).ok());
  EXPECT_FALSE(fs::exists(scratch));
  EXPECT_FALSE(q.Pending("b", b.ref.id));
  EXPECT_EQ(q.Scan()->size(), 1u);
}

TEST(UploadQueue, Malicious_BadEntriesAreReportedAndLeft) {
  test_support::TempDir tmp("upload-queue");
  UploadQueueDir q(tmp.path());
  fs::create_directories(tmp.path() / "vm");
  std::ofstream(tmp.path() / "vm" / "junk.json") << "{not json";
  std::ofstream(tmp.path() / "vm" / "other.json") << R"({"format": "something-else"})";
  UploadEntry evil = Entry("vm", "x", 1);
  nlohmann::json doc = evil.ToJson();
  doc["objects"][0]["file"] = "../../etc/shadow";
  std::ofstream(tmp.path() / "vm" / "evil.json") << doc.dump();
  // A good entry reached through a symlink is not read (it could point at
  // any file), and neither is one past the 1 MiB cap.
  std::ofstream(tmp.path() / "good.json") << Entry("vm", "y", 2).ToJson().dump();
  fs::create_symlink(tmp.path() / "good.json", tmp.path() / "vm" / "link.json");
  std::ofstream(tmp.path() / "vm" / "huge.json") << std::string((1u << 20) + 1, ' ');
  std::vector<std::string> bad;
  auto all = q.Scan(&bad);
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(all->empty());
  EXPECT_EQ(bad.size(), 5u);
  EXPECT_TRUE(fs::exists(tmp.path() / "vm" / "junk.json"));
}

TEST(S3Credentials, ParseAndRefuseLooseFiles) {
  auto ok = ParseS3Credentials("# fleet\naccess_key = AK\nsecret_key = S K\n", "f");
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ(ok->access_key, "AK");
  EXPECT_EQ(ok->secret_key, "S K");
  EXPECT_FALSE(ParseS3Credentials("access_key = AK\n", "f").ok());
  auto unknown = ParseS3Credentials("access_key = AK\nsecret = TOPSECRET\n", "f");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.error().message.find("TOPSECRET"), std::string::npos);

  test_support::TempDir tmp("creds");
  const fs::path path = tmp.path() / "credentials";
  std::ofstream(path) << "access_key = AK\nsecret_key = SK\n";
  ::chmod(path.c_str(), 0644);
  auto loose = LoadS3Credentials(path, true);
  ASSERT_FALSE(loose.ok());
  EXPECT_NE(loose.error().message.find(path.string()), std::string::npos);
  EXPECT_NE(loose.error().message.find("group or others"), std::string::npos);
  EXPECT_TRUE(LoadS3Credentials(path, false).ok());  // The CLI: the user's own file.
  ::chmod(path.c_str(), 0600);
  EXPECT_TRUE(LoadS3Credentials(path, true).ok());
  if (::geteuid() == 0) {
    // Owned by someone else (not root, not us): refused.
    ASSERT_EQ(::chown(path.c_str(), 4242, 4242), 0);
    auto foreign = LoadS3Credentials(path, true);
    ASSERT_FALSE(foreign.ok());
    EXPECT_NE(foreign.error().message.find("owned by root"), std::string::npos);
  }
  EXPECT_FALSE(LoadS3Credentials(tmp.path() / "missing", true).ok());
}

}  // namespace
}  // namespace hvtrace::hostd
