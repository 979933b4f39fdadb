// `hvtrace formats harvest` against the real 6.12 guest: boot the kernel in a
// throwaway TCG VM, bring its formats home over virtio-serial, cache them,
// and find them there again without booting.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "formats_bundle.h"
#include "formats_cache.h"
#include "formats_harvest.h"
#include "guest_harness.h"
#include "hvtrace/format.h"
#include "sha256.h"
#include "test_support.h"

namespace hvtrace::e2e {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

using test_support::ReadText;

std::string RunAndCapture(const std::string& cmd, int* status) {
  test_support::CommandResult r = test_support::RunCommandStatus(cmd);
  *status = r.status;
  return r.out;
}

const hostd::CachedEventFormat* Find(const hostd::KernelFormats& k, const std::string& system,
                                     const std::string& name) {
  for (const auto& e : k.events) {
    if (e.system == system && e.name == name) return &e;
  }
  return nullptr;
}

TEST(FormatsHarvestE2eTest, Harvests612FormatsThenHitsTheCache) {
  if (std::string why = QemuUnavailableReason(); !why.empty()) {
    GTEST_SKIP() << "QEMU cannot run here: " << why;
  }
  Result<GuestImage> image = FindGuestImage("6.12");
  ASSERT_TRUE(image.ok()) << image.error().message;
  std::string tmpl = (fs::temp_directory_path() / "hvtrace-harvest-e2e-XXXXXX").string();
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  const fs::path cache_root = tmpl;
  struct Cleanup {
    fs::path p;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(p, ec);
    }
  } cleanup{cache_root};

  hostd::HarvestOptions options;
  options.kernel = image->kernel;
  options.initrd = image->initrd;
  options.cache_root = cache_root;
  options.boot_timeout = kBootTimeout;
  const Clock::time_point t0 = Clock::now();
  Result<hostd::HarvestResult> first = hostd::HarvestFormats(options);
  ASSERT_TRUE(first.ok()) << first.error().message;
  const double harvest_s = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_FALSE(first->cache_hit);
  RecordProperty("harvest_seconds", std::to_string(harvest_s));
  RecordProperty("boot_seconds",
                 std::to_string(first->manifest["harvest"].value("boot_seconds", 0.0)));
  std::printf("harvest: %.1f s (boot %.1f s, collect %.1f s, transfer %.2f s), %zu events\n",
              harvest_s, first->manifest["harvest"].value("boot_seconds", 0.0),
              first->manifest["harvest"].value("collect_seconds", 0.0),
              first->manifest["harvest"].value("transfer_seconds", 0.0),
              first->manifest.value("events", size_t{0}));

  // The key is the image's SHA-256, the entry is where the result says.
  EXPECT_EQ(first->key, hostd::Sha256File(image->kernel).value());
  EXPECT_EQ(first->entry_dir, cache_root / "formats" / first->key);
  // No temporary directory is left beside the entry.
  size_t entries = 0;
  for (const auto& e : fs::directory_iterator(cache_root / "formats")) {
    ++entries;
    EXPECT_EQ(e.path().filename().string(), first->key);
  }
  EXPECT_EQ(entries, 1u);

  hostd::FormatCache cache(cache_root);
  Result<hostd::KernelFormats> k = cache.Load(first->key);
  ASSERT_TRUE(k.ok()) << k.error().message;
  EXPECT_EQ(k->release, image->release);
  EXPECT_THAT(k->proc_version, HasSubstr("Linux version " + image->release));
  // A distribution kernel has well over a thousand events.
  EXPECT_GT(k->events.size(), 1000u);
  EXPECT_TRUE(k->manifest["rejected_formats"].empty()) << k->manifest["rejected_formats"].dump(1);
  // Formats our parser refuses are kept and listed; they should be rare.
  EXPECT_LT(k->manifest["unparsed_formats"].size(), 5u) << k->manifest["unparsed_formats"].dump(1);
  if (!k->manifest["unparsed_formats"].empty()) {
    std::printf("formats our parser refuses: %s\n",
                k->manifest["unparsed_formats"].dump(1).c_str());
  }

  struct Want {
    const char* system;
    const char* name;
    std::vector<const char*> fields;
  } wants[] = {
      {"sched", "sched_switch", {"prev_comm", "prev_pid", "prev_state", "next_comm", "next_pid"}},
      {"ftrace", "print", {"ip", "buf"}},
      {"irq", "irq_handler_entry", {"irq", "name"}}};
  for (const Want& w : wants) {
    SCOPED_TRACE(std::string(w.system) + "/" + w.name);
    const hostd::CachedEventFormat* e = Find(*k, w.system, w.name);
    ASSERT_NE(e, nullptr);
    Result<EventFormat> f = ParseEventFormat(e->system, e->text);
    ASSERT_TRUE(f.ok()) << f.error().message;
    EXPECT_EQ(f->name, w.name);
    EXPECT_NE(f->id, 0u);
    for (const char* field : w.fields) EXPECT_NE(f->FindField(field), nullptr) << field;
  }
  EXPECT_TRUE(ParseHeaderPage(k->header_page).ok());
  EXPECT_TRUE(ParseHeaderEvent(k->header_event).ok());
  Result<uint64_t> stext = hostd::FindKallsym(k->kallsyms, "_stext");
  ASSERT_TRUE(stext.ok()) << stext.error().message;
  EXPECT_NE(*stext, 0u) << "kallsyms addresses are hidden (kptr_restrict)";
  EXPECT_FALSE(k->printk_formats.empty());

  // Built-in event ids are a property of the build, not of the boot: the
  // fixture formats were read from another boot of this kernel (2 vCPUs, a
  // boot buffer on the command line) and must be identical, ids included.
  const fs::path fixtures = fs::path(HVTRACE_FIXTURES_DIR) / "boot_map";
  if (ReadText(fixtures / "meta.json").find("\"" + image->release + "\"") != std::string::npos) {
    size_t compared = 0;
    for (const auto& e : fs::recursive_directory_iterator(fixtures / "formats")) {
      if (e.path().filename() != "format") continue;
      const std::string name = e.path().parent_path().filename().string();
      const std::string system = e.path().parent_path().parent_path().filename().string();
      const hostd::CachedEventFormat* got = Find(*k, system, name);
      ASSERT_NE(got, nullptr) << system << "/" << name;
      EXPECT_EQ(got->text, ReadText(e.path())) << system << "/" << name;
      ++compared;
    }
    EXPECT_GE(compared, 3u);
  }

  // Second harvest of the same kernel: a cache hit, no VM.
  const Clock::time_point t1 = Clock::now();
  Result<hostd::HarvestResult> second = hostd::HarvestFormats(options);
  ASSERT_TRUE(second.ok()) << second.error().message;
  const double hit_s = std::chrono::duration<double>(Clock::now() - t1).count();
  EXPECT_TRUE(second->cache_hit);
  EXPECT_EQ(second->key, first->key);
  EXPECT_LT(hit_s, 5.0);  // Hashing 12 MB; no guest boots.
  RecordProperty("cache_hit_seconds", std::to_string(hit_s));

  // The CLI reads the same cache.
  const std::string cli = std::string(HVTRACE_BIN_DIR) + "/hvtrace";
  struct stat st;
  if (::stat(cli.c_str(), &st) == 0) {
    int status = 0;
    const std::string list =
        RunAndCapture(cli + " formats list --cache " + cache_root.string(), &status);
    EXPECT_EQ(status, 0) << list;
    EXPECT_THAT(list, HasSubstr(image->release));
    EXPECT_THAT(list, HasSubstr(first->key.substr(0, 16)));
    // Without --initrd: the project's own harvest initramfs beside the binary.
    const std::string again = RunAndCapture(cli + " formats harvest --kernel " + image->kernel +
                                                " --cache " + cache_root.string() + " 2>&1",
                                            &status);
    EXPECT_EQ(status, 0) << again;
    EXPECT_THAT(again, HasSubstr("key       " + first->key));
    EXPECT_THAT(again, HasSubstr("status    cached"));
  }
}

// A kernel whose virtio_console is a module the initrd does not load gets a
// clear error, not a hang, and nothing is cached. The project's 6.1 initrd
// loads it (build-guest.sh's default modules), so the test removes it from a
// copy of that initrd: the initramfs a user built without it.
TEST(FormatsHarvestE2eTest, KernelWithoutVirtioConsoleFailsClearly) {
  if (std::string why = QemuUnavailableReason(); !why.empty()) {
    GTEST_SKIP() << "QEMU cannot run here: " << why;
  }
  Result<GuestImage> image = FindGuestImage("6.1");
  ASSERT_TRUE(image.ok()) << image.error().message;
  const std::string config = ReadText(fs::path(image->initrd).parent_path() / "config");
  ASSERT_NE(config.find("CONFIG_VIRTIO_CONSOLE=m"), std::string::npos)
      << "Debian's 6.1 builds virtio_console as a module; this kernel does not";
  std::string tmpl = (fs::temp_directory_path() / "hvtrace-harvest-e2e-XXXXXX").string();
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  struct Cleanup {
    fs::path p;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(p, ec);
    }
  } cleanup{tmpl};
  const fs::path root = fs::path(tmpl) / "root", initrd = fs::path(tmpl) / "initrd.img";
  fs::create_directories(root);
  const std::string repack =
      "cd '" + root.string() + "' && gzip -dc '" + image->initrd +
      "' | cpio -id --quiet && sed -i '/^virtio_console$/d' etc/hvtrace/modules && "
      "find . -name 'virtio_console.ko' -delete && find . | cpio -o -H newc --quiet -R 0:0 | "
      "gzip > '" +
      initrd.string() + "'";
  ASSERT_EQ(std::system(repack.c_str()), 0) << repack;
  const fs::path cache_root = fs::path(tmpl) / "cache";
  fs::create_directories(cache_root);
  hostd::HarvestOptions options;
  options.kernel = image->kernel;
  options.initrd = initrd.string();
  options.cache_root = cache_root.string();
  options.boot_timeout = kBootTimeout;
  Result<hostd::HarvestResult> r = hostd::HarvestFormats(options);
  ASSERT_FALSE(r.ok()) << "harvested " << r->manifest.value("events", size_t{0})
                       << " events without virtio_console";
  EXPECT_THAT(r.error().message, HasSubstr("no virtio-serial port"));
  EXPECT_THAT(r.error().message, HasSubstr("HVTRACE_GUEST_EXTRA_MODULES"));
  hostd::FormatCache cache(cache_root);
  EXPECT_TRUE(cache.List().value().empty());
}

}  // namespace
}  // namespace hvtrace::e2e
