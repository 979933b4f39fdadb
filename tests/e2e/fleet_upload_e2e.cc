// The fleet upload end to end against a real Ceph RGW (ceph_fixture.h) and a
// real 6.12 guest under TCG, driven through hvtraced and the `hvtrace` CLI:
//
//  - the store goes down, the guest panics: the capture is committed locally
//    and queued (ping names the error), survives an hvtraced restart, and is
//    uploaded once the store is back: every object byte-identical to the
//    local file (region files decompress to it), the index objects last,
//    nothing twice (the exact object count) and no multipart upload left;
//    `hvtrace fleet list` shows it, `fleet fetch` gets it, and `hvtrace
//    show` prints the same for the fetched copy as for the local one;
//  - wrong credentials, then a missing bucket: clear errors in the log and in
//    ping, the capture stays local and queued, and goes up once fixed.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "fleet_e2e_support.h"
#include "fleet_keys.h"
#include "formats_cache.h"
#include "guest_harness.h"
#include "host_command.h"
#include "hvtraced_harness.h"
#include "s3_client.h"
#include "uploader.h"
#include "zstd_file.h"

namespace hvtrace::e2e {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr const char* kPrefix = "e2e";

std::string UploadConfig(const CephCluster& ceph, const std::string& bucket,
                         const std::string& credentials) {
  return "upload_endpoint = " + ceph.endpoint() + "\nupload_bucket = " + bucket +
         "\nupload_region = default\nupload_credentials = " + credentials +
         "\nupload_prefix = " + kPrefix + "\nupload_retry_max = 2s\n";
}

hostd::S3Client Client(const CephCluster& ceph, const std::string& bucket) {
  hostd::S3Config c;
  c.endpoint = ceph.endpoint();
  c.bucket = bucket;
  c.region = "default";
  c.access_key = ceph.access_key();
  c.secret_key = ceph.secret_key();
  return hostd::S3Client(c);
}

// Polls ping until |pred| holds for its "upload" object (the last one seen).
Result<json> WaitForUpload(const HvtracedProcess& daemon,
                           const std::function<bool(const json&)>& pred,
                           std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  json last;
  while (std::chrono::steady_clock::now() < deadline) {
    auto pong = daemon.Call("ping", json::object());
    if (pong.ok()) {
      last = (*pong)["upload"];
      if (pred(last)) return last;
    }
    std::this_thread::sleep_for(200ms);
  }
  return Error{"upload state never matched; last: " + last.dump() + "\n" + daemon.LogTail()};
}

// Checks that the capture in |local| is in the bucket object by object,
// byte-identical, with both index objects and nothing else. Returns the
// listing index document.
json ExpectUploaded(const CephCluster& ceph, const std::string& bucket, const fs::path& local,
                    const hostd::FleetCaptureRef& ref) {
  hostd::S3Client s3 = Client(ceph, bucket);
  const std::string base = hostd::CaptureKeyPrefix(kPrefix, ref);
  auto objects = s3.List(base);
  EXPECT_TRUE(objects.ok()) << objects.error().message;
  if (!objects.ok()) return {};
  const json manifest = json::parse(ReadWhole((local / "manifest.json").string()));
  std::set<std::string> want = {"manifest.json", "index.json"};
  for (const json& f : manifest["files"])
    want.insert(hostd::ObjectNameOf(f["name"].get<std::string>()));
  std::set<std::string> got;
  for (const hostd::S3Object& o : *objects) got.insert(o.key.substr(base.size()));
  EXPECT_EQ(got, want);  // Nothing missing, nothing twice, nothing stray.
  const fs::path scratch = fs::path(ceph.dir()) / ("check-" + ref.id);
  fs::create_directories(scratch);
  for (const std::string& name : want) {
    if (name == "index.json") continue;
    const fs::path obj = scratch / name;
    fs::remove(obj);
    Status s = s3.GetToFile(base + name, obj, 1ull << 32);
    EXPECT_TRUE(s.ok()) << s.error().message;
    std::string local_name = name;
    fs::path compare = obj;
    // Only what the uploader compressed (.bin) is stored with .zst added; a
    // capture's own .zst files (printk-memory.zst) are stored as they are.
    if (name.ends_with(".zst") && !fs::exists(local / name)) {
      local_name = name.substr(0, name.size() - 4);
      compare = scratch / (local_name + ".plain");
      fs::remove(compare);
      Status d = hostd::DecompressFile(obj, compare, 1ull << 32);
      EXPECT_TRUE(d.ok()) << d.error().message;
    }
    EXPECT_TRUE(ReadWhole(compare.string()) == ReadWhole((local / local_name).string()))
        << name << " differs from the local " << local_name;
  }
  auto index = s3.GetBytes(hostd::IndexListKey(kPrefix, ref), 1 << 20);
  EXPECT_TRUE(index.ok()) << index.error().message;
  auto capture_index = s3.GetBytes(base + "index.json", 1 << 20);
  EXPECT_TRUE(capture_index.ok());
  if (!index.ok() || !capture_index.ok()) return {};
  EXPECT_EQ(*index, *capture_index);
  auto uploads = s3.ListMultipartUploads("");
  EXPECT_TRUE(uploads.ok());
  if (uploads.ok()) {
    EXPECT_TRUE(uploads->empty()) << uploads->size() << " multipart upload(s) left";
  }
  return json::parse(*index);
}

std::vector<std::string> FleetArgs(const CephCluster& ceph, const std::string& bucket,
                                   const std::string& credentials) {
  return {"--endpoint", ceph.endpoint(), "--bucket", bucket,          "--region",
          "default",    "--prefix",      kPrefix,    "--credentials", credentials};
}

RunResult Hvtrace(std::vector<std::string> args) {
  args.insert(args.begin(), BinPath("hvtrace"));
  return RunArgvStatus(args);
}

TEST(FleetUploadE2e, PanicWhileTheStoreIsDownIsUploadedAfterRestartAndFetched) {
  HVTRACE_REQUIRE_CEPH(ceph);
  if (std::string why = QemuUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  auto image = FindGuestImage("6.12");
  ASSERT_TRUE(image.ok()) << image.error().message;
  auto cache_root = hostd::DefaultCacheRoot();
  ASSERT_TRUE(cache_root.ok()) << cache_root.error().message;
  auto harvested = HarvestImage(*image, *cache_root);
  ASSERT_TRUE(harvested.ok()) << harvested.error().message;

  const std::string bucket = "fleet-panic";
  ASSERT_TRUE(ceph.CreateBucket(bucket).ok());
  auto creds = ceph.WriteCredentials("fleet-panic.creds", ceph.access_key(), ceph.secret_key());
  ASSERT_TRUE(creds.ok()) << creds.error().message;
  HvtracedProcess daemon({.tag = "fleet",
                          .config = "vm_on_shutdown = stop\ncache_dir = " + cache_root->string() +
                                    "\n" + UploadConfig(ceph, bucket, *creds)});
  Status started = daemon.Start();
  ASSERT_TRUE(started.ok()) << started.error().message;
  const std::string name = "fleet-" + std::to_string(::getpid());
  auto guest = BootDaemonGuest(daemon, name, image->kernel, image->initrd);
  ASSERT_TRUE(guest.ok()) << guest.error().message;
  auto tail = [&] { return ConsoleAndLog(*guest, daemon); };
  ASSERT_TRUE(guest->console->WaitForLine("HVTRACE-GUEST-READY", kBootTimeout).ok()) << tail();
  const std::string marker = "/sys/kernel/tracing/instances/boot_map/trace_marker";
  auto ran = guest->console->Run(
      "for i in $(seq 1 10); do echo fleet-mark-$i > " + marker + "; done", kCommandTimeout);
  ASSERT_TRUE(ran.ok() && ran->status == 0) << tail();

  // The store goes down; the guest panics. It comes back even if an
  // assertion ends this test early: the tests after it share the store.
  struct StoreComesBack {
    CephCluster& ceph;
    bool up = false;
    ~StoreComesBack() {
      if (!up) (void)ceph.StartRgw();
    }
  } store_back{ceph};
  ceph.StopRgw();
  ASSERT_TRUE(
      guest->console->Send("echo fleet-last > " + marker + "; echo c > /proc/sysrq-trigger\n")
          .ok());
  auto panic = daemon.WaitForCapture(name, "panic", 90s);
  ASSERT_TRUE(panic.ok()) << panic.error().message << tail();
  const std::string id = (*panic)["id"];
  const fs::path local = fs::path(daemon.captures_dir(name)) / id;
  const fs::path entry = fs::path(daemon.state_dir()) / "upload-queue" / name / (id + ".json");
  auto failing = WaitForUpload(
      daemon,
      [](const json& u) {
        return u.value("pending", 0) == 1 && !u.value("last_error", "").empty();
      },
      60s);
  ASSERT_TRUE(failing.ok()) << failing.error().message;
  std::printf("[fleet e2e] store down: %s\n", (*failing)["last_error"].get<std::string>().c_str());
  EXPECT_NE((*failing)["last_error"].get<std::string>().find(ceph.endpoint()), std::string::npos);
  EXPECT_TRUE(fs::exists(local / "manifest.json"));
  EXPECT_TRUE(fs::exists(entry));
  RunResult ping = Hvtrace({"ping", "--socket", daemon.socket()});
  EXPECT_NE(ping.output.find("1 pending"), std::string::npos) << ping.output;
  EXPECT_TRUE(daemon.WaitForLog("stays local and queued", 5s)) << daemon.LogTail();

  // Across a restart: the queue is on disk; the store comes back.
  daemon.Stop();
  store_back.up = true;  // Tried once: its result is asserted here.
  ASSERT_TRUE(ceph.StartRgw().ok()) << ceph.Logs();
  const auto back = std::chrono::steady_clock::now();
  started = daemon.Start();
  ASSERT_TRUE(started.ok()) << started.error().message;
  auto done = WaitForUpload(
      daemon,
      [](const json& u) { return u.value("uploaded", 0) == 1 && u.value("pending", 1) == 0; },
      120s);
  ASSERT_TRUE(done.ok()) << done.error().message;
  std::printf("[fleet e2e] uploaded %.1f s after the restart with the store back\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - back).count());
  EXPECT_FALSE(fs::exists(entry));
  EXPECT_TRUE(fs::exists(local / "manifest.json"));  // Retention keeps it as before.

  const hostd::FleetCaptureRef ref{hostd::FleetHostName(), name, id};
  json index = ExpectUploaded(ceph, bucket, local, ref);
  EXPECT_EQ(index.value("trigger", ""), "panic");
  EXPECT_EQ(index.value("vm", ""), name);
  EXPECT_FALSE(index["kernel"].value("release", "").empty()) << index.dump(1);
  EXPECT_GT(index["totals"].value("events", 0), 0) << index.dump(1);
  // The marker written just before the crash: among the panicking CPU's
  // last events (the crash's), or the trace's if the shell moved CPUs
  // between the two writes. The trace's last events alone are often
  // another CPU idling while the panic prints.
  bool saw_last_marker = false;
  std::vector<json> lists{index.value("crash", json::object()).value("events_before", json())};
  for (const auto& [file, lines] : index["last_events"].items()) lists.push_back(lines);
  for (const json& lines : lists) {
    if (!lines.is_array()) continue;
    for (const json& l : lines)
      saw_last_marker |= l.get<std::string>().find("fleet-last") != std::string::npos;
  }
  EXPECT_TRUE(saw_last_marker) << index.dump(1);
  // Why the guest died, in the index a fleet listing reads.
  EXPECT_EQ(index.value("crash", json::object()).value("panic_line", ""),
            "Kernel panic - not syncing: sysrq triggered crash")
      << index.dump(1);

  // The fleet commands, as any machine with read credentials runs them.
  std::vector<std::string> args = FleetArgs(ceph, bucket, *creds);
  std::vector<std::string> list = {"fleet", "list"};
  list.insert(list.end(), args.begin(), args.end());
  RunResult listed = Hvtrace(list);
  ASSERT_EQ(listed.status, 0) << listed.output;
  EXPECT_NE(listed.output.find(ref.Name()), std::string::npos) << listed.output;
  std::vector<std::string> filtered = list;
  filtered.insert(filtered.end(), {"--trigger", "manual"});
  EXPECT_EQ(Hvtrace(filtered).output.find(ref.Name()), std::string::npos);
  std::vector<std::string> as_json = list;
  as_json.insert(as_json.end(), {"--host", ref.host, "--vm", name, "--trigger", "panic", "--since",
                                 "1h", "--json"});
  RunResult json_out = Hvtrace(as_json);
  ASSERT_EQ(json_out.status, 0) << json_out.output;
  json parsed = json::parse(json_out.output, nullptr, false);
  ASSERT_FALSE(parsed.is_discarded()) << json_out.output;
  ASSERT_EQ(parsed["captures"].size(), 1u) << json_out.output;
  EXPECT_EQ(parsed["captures"][0]["id"], id);

  const fs::path fetched = fs::path(daemon.dir()) / "fetched";
  std::vector<std::string> fetch = {"fleet", "fetch", ref.Name(), "--to", fetched.string()};
  fetch.insert(fetch.end(), args.begin(), args.end());
  RunResult got = Hvtrace(fetch);
  ASSERT_EQ(got.status, 0) << got.output;
  for (const auto& f : fs::directory_iterator(local)) {
    EXPECT_TRUE(ReadWhole(f.path().string()) == ReadWhole((fetched / f.path().filename()).string()))
        << f.path().filename();
  }
  auto show_local = RunArgv({BinPath("hvtrace"), "show", local.string()});
  auto show_fetched = RunArgv({BinPath("hvtrace"), "show", fetched.string()});
  ASSERT_TRUE(show_local.ok()) << show_local.error().message;
  ASSERT_TRUE(show_fetched.ok()) << show_fetched.error().message;
  std::string a = *show_local, b = *show_fetched;
  // The directory names itself in the header; the rest must be the same.
  for (std::string* s : {&a, &b}) {
    for (const std::string& dir : {local.string(), fetched.string()}) {
      for (size_t p = s->find(dir); p != std::string::npos; p = s->find(dir)) {
        s->replace(p, dir.size(), "DIR");
      }
    }
  }
  EXPECT_GT(a.size(), 1000u);
  EXPECT_TRUE(a == b) << "hvtrace show differs between the local and the fetched capture";
}

// A capture as hvtraced commits it (manifest + a sparse-ish region.bin),
// planted in the state dir with its queue entry, as a run that died right
// after queueing it leaves them.
fs::path PlantCapture(const HvtracedProcess& daemon, const std::string& vm, const std::string& id,
                      const std::string& bucket_prefix) {
  const fs::path dir = fs::path(daemon.captures_dir(vm)) / id;
  fs::create_directories(dir);
  std::mt19937 rng(7);
  std::string region(3u << 20, '\0');
  for (size_t i = 0; i < (1u << 20); ++i) region[i] = static_cast<char>(rng());
  std::ofstream(dir / "region.bin", std::ios::binary) << region;
  json m = {{"format", "hvtrace-capture"},
            {"version", 2},
            {"vm", vm},
            {"trigger", "panic"},
            {"id", id},
            {"host_time", {{"triggered", {{"utc", "20261125T000000.000Z"}, {"realtime_ns", 1}}}}},
            {"kernel", {{"release", "6.12.0-test"}}},
            {"totals", {{"events", 0}}},
            {"files", json::array({{{"name", "region.bin"}, {"bytes", region.size()}}})}};
  std::ofstream(dir / "manifest.json") << m.dump(1);
  auto entry = hostd::MakeUploadEntry({hostd::FleetHostName(), vm, id}, bucket_prefix, dir, 1);
  EXPECT_TRUE(entry.ok()) << entry.error().message;
  hostd::UploadQueueDir queue(fs::path(daemon.state_dir()) / "upload-queue");
  EXPECT_TRUE(queue.Save(*entry).ok());
  return dir;
}

TEST(FleetUploadE2e, WrongCredentialsAndMissingBucketLoseNothing) {
  HVTRACE_REQUIRE_CEPH(ceph);
  const std::string bucket = "fleet-late";  // Made only at the end.
  auto creds = ceph.WriteCredentials("fleet-late.creds", ceph.access_key(), "not-the-secret");
  ASSERT_TRUE(creds.ok());
  HvtracedProcess daemon({.tag = "fleetcred", .config = UploadConfig(ceph, bucket, *creds)});
  const std::string vm = "planted";
  const std::string id = "20261125T000000.000Z-panic";
  fs::create_directories(daemon.state_dir());
  const fs::path local = PlantCapture(daemon, vm, id, kPrefix);
  const fs::path entry = fs::path(daemon.state_dir()) / "upload-queue" / vm / (id + ".json");

  // A credentials file others may read is refused at start, naming it.
  ::chmod(creds->c_str(), 0644);
  Status refused = daemon.Start();
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(daemon.log().find(*creds), std::string::npos) << daemon.LogTail();
  EXPECT_NE(daemon.log().find("group or others"), std::string::npos) << daemon.LogTail();
  ::chmod(creds->c_str(), 0600);

  // The wrong secret: the store's own word, in ping and in the log.
  ASSERT_TRUE(daemon.Start().ok()) << daemon.LogTail();
  auto wrong = WaitForUpload(
      daemon,
      [](const json& u) {
        return u.value("last_error", "").find("SignatureDoesNotMatch") != std::string::npos;
      },
      30s);
  ASSERT_TRUE(wrong.ok()) << wrong.error().message;
  EXPECT_EQ((*wrong)["pending"], 1);
  EXPECT_TRUE(daemon.WaitForLog("SignatureDoesNotMatch", 5s));
  EXPECT_TRUE(fs::exists(entry));
  EXPECT_TRUE(fs::exists(local / "region.bin"));
  daemon.Stop();

  // The right secret, but no bucket yet.
  ASSERT_TRUE(ceph.WriteCredentials("fleet-late.creds", ceph.access_key(), ceph.secret_key()).ok());
  ASSERT_TRUE(daemon.Start().ok()) << daemon.LogTail();
  auto missing = WaitForUpload(
      daemon,
      [](const json& u) {
        return u.value("last_error", "").find("NoSuchBucket") != std::string::npos;
      },
      30s);
  ASSERT_TRUE(missing.ok()) << missing.error().message;
  EXPECT_TRUE(daemon.WaitForLog("NoSuchBucket", 5s));
  EXPECT_TRUE(fs::exists(entry));
  std::printf("[fleet e2e] wrong secret: %s\n[fleet e2e] missing bucket: %s\n",
              (*wrong)["last_error"].get<std::string>().c_str(),
              (*missing)["last_error"].get<std::string>().c_str());

  // The bucket appears: the next retry (at most upload_retry_max) uploads it.
  ASSERT_TRUE(ceph.CreateBucket(bucket).ok());
  auto done = WaitForUpload(
      daemon,
      [](const json& u) { return u.value("uploaded", 0) == 1 && u.value("pending", 1) == 0; }, 30s);
  ASSERT_TRUE(done.ok()) << done.error().message;
  EXPECT_FALSE(fs::exists(entry));
  json index = ExpectUploaded(ceph, bucket, local, {hostd::FleetHostName(), vm, id});
  EXPECT_EQ(index["kernel"]["release"], "6.12.0-test");
}

// The daemon dies between a capture's commit and its queue entry (the test
// build hvtraced-crash-before-upload-queued SIGKILLs itself there): the
// capture is on disk, no entry records it. The next run's start-up scan finds
// it (committed, no entry, no confirmation from the store) and uploads it.
TEST(FleetUploadE2e, CommittedCaptureWhoseEntryWasNeverWrittenReachesTheStoreAfterRestart) {
  HVTRACE_REQUIRE_CEPH(ceph);
  if (std::string why = QemuUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  auto image = FindGuestImage("6.12");
  ASSERT_TRUE(image.ok()) << image.error().message;
  const std::string bucket = "fleet-crash";
  ASSERT_TRUE(ceph.CreateBucket(bucket).ok());
  auto creds = ceph.WriteCredentials("fleet-crash.creds", ceph.access_key(), ceph.secret_key());
  ASSERT_TRUE(creds.ok()) << creds.error().message;
  HvtracedProcess daemon(
      {.tag = "fleetkill",
       .config = "vm_on_shutdown = stop\nharvest_initrd = /nonexistent/hvtrace-no-harvest.img\n" +
                 UploadConfig(ceph, bucket, *creds)});
  daemon.SetBinary("hvtraced-crash-before-upload-queued");
  ASSERT_TRUE(daemon.Start().ok()) << daemon.LogTail();
  const std::string name = "fleetkill-" + std::to_string(::getpid());
  auto guest = BootDaemonGuest(daemon, name, image->kernel, image->initrd);
  ASSERT_TRUE(guest.ok()) << guest.error().message;
  auto tail = [&] { return ConsoleAndLog(*guest, daemon); };
  ASSERT_TRUE(guest->console->WaitForLine("HVTRACE-GUEST-READY", kBootTimeout).ok()) << tail();

  // The capture commits, then the daemon dies before queueing it.
  auto captured = daemon.Call("capture", {{"name", name}}, 60s);
  EXPECT_FALSE(captured.ok()) << "the daemon should have died before it replied";
  auto exited = daemon.WaitExit(30s);
  ASSERT_TRUE(exited.ok()) << exited.error().message;
  ASSERT_TRUE(WIFSIGNALED(*exited) && WTERMSIG(*exited) == SIGKILL) << *exited;
  std::vector<fs::path> committed;
  for (const auto& e : fs::directory_iterator(daemon.captures_dir(name))) {
    const std::string id = e.path().filename().string();
    if (id[0] != '.' && fs::exists(e.path() / "manifest.json")) committed.push_back(e.path());
  }
  ASSERT_EQ(committed.size(), 1u) << "one committed capture";
  const fs::path local = committed[0];
  const std::string id = local.filename().string();
  const fs::path entry = fs::path(daemon.state_dir()) / "upload-queue" / name / (id + ".json");
  ASSERT_FALSE(fs::exists(entry)) << "the test seam fired after the entry was written";

  daemon.SetBinary("hvtraced");
  ASSERT_TRUE(daemon.Start().ok()) << daemon.LogTail();
  auto done = WaitForUpload(
      daemon,
      [](const json& u) { return u.value("uploaded", 0) == 1 && u.value("pending", 1) == 0; }, 60s);
  ASSERT_TRUE(done.ok()) << done.error().message;
  EXPECT_TRUE(daemon.WaitForLog("had no queue entry", 1s)) << daemon.LogTail();
  EXPECT_FALSE(fs::exists(entry));
  ExpectUploaded(ceph, bucket, local, {hostd::FleetHostName(), name, id});
  // Confirmed once: a further restart does not queue it again.
  daemon.Stop();
  ASSERT_TRUE(daemon.Start().ok()) << daemon.LogTail();
  auto pong = daemon.Call("ping", json::object());
  ASSERT_TRUE(pong.ok());
  for (const json& row : (*pong)["upload"]["captures"])
    EXPECT_NE(row["id"], id) << "queued again: " << pong->dump(2);
  const std::string log = daemon.log();
  EXPECT_EQ(log.find("had no queue entry"), log.rfind("had no queue entry"))
      << "the third run queued it again\n"
      << daemon.LogTail();
  std::printf("[fleet e2e] capture %s committed before the crash, uploaded after the restart\n",
              id.c_str());
}

// A capture whose local file cannot be read any more (its region.bin turned
// into a directory) is not retried forever: after its local attempts it is
// given up, ping and the log say which capture, which file and why, and the
// capture stays on disk.
TEST(FleetUploadE2e, AnUnreadableCaptureIsGivenUpAfterItsRetries) {
  HVTRACE_REQUIRE_CEPH(ceph);
  const std::string bucket = "fleet-unreadable";
  ASSERT_TRUE(ceph.CreateBucket(bucket).ok());
  auto creds =
      ceph.WriteCredentials("fleet-unreadable.creds", ceph.access_key(), ceph.secret_key());
  ASSERT_TRUE(creds.ok());
  HvtracedProcess daemon({.tag = "fleetbad", .config = UploadConfig(ceph, bucket, *creds)});
  const std::string vm = "planted";
  const std::string id = "20261125T000000.000Z-panic";
  fs::create_directories(daemon.state_dir());
  const fs::path local = PlantCapture(daemon, vm, id, kPrefix);
  fs::remove(local / "region.bin");
  fs::create_directory(local / "region.bin");
  const fs::path entry = fs::path(daemon.state_dir()) / "upload-queue" / vm / (id + ".json");
  ASSERT_TRUE(daemon.Start().ok()) << daemon.LogTail();
  auto given_up = WaitForUpload(
      daemon, [](const json& u) { return u.value("given_up", 0) == 1; }, 90s);
  ASSERT_TRUE(given_up.ok()) << given_up.error().message;
  const std::string error = (*given_up)["last_error"];
  EXPECT_NE(error.find("capture planted/" + id), std::string::npos) << error;
  EXPECT_NE(error.find("given up after 5 attempts"), std::string::npos) << error;
  EXPECT_NE(error.find((local / "region.bin").string()), std::string::npos) << error;
  EXPECT_EQ((*given_up)["pending"], 0);
  EXPECT_TRUE(daemon.WaitForLog("upload given up after 5 attempts", 5s)) << daemon.LogTail();
  EXPECT_FALSE(fs::exists(entry));
  EXPECT_TRUE(fs::exists(local / "manifest.json"));
  // `hvtrace ping` (the CLI) shows it.
  const RunResult ping = daemon.Hvtrace({"ping"});
  EXPECT_NE(ping.output.find("given up"), std::string::npos) << ping.output;
  std::printf("[fleet e2e] unreadable capture: %s\n", error.c_str());
}

}  // namespace
}  // namespace hvtrace::e2e
