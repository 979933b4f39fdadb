// hvtrace fleet list / fetch: the captures every host uploaded
// (docs/fleet.md), read straight from the S3 bucket with read credentials;
// no daemon, no root. The bucket's contents are untrusted: keys are checked
// before they become local file names, downloads and decompression are
// capped, and a capture without its listing index (an upload in progress)
// is not fetched.
//
// Where the store is: --endpoint --bucket --region --prefix --credentials,
// else $HVTRACE_FLEET_ENDPOINT, _BUCKET, _REGION, _PREFIX, _CREDENTIALS;
// without a credentials file, $AWS_ACCESS_KEY_ID and $AWS_SECRET_ACCESS_KEY.
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "capture_index.h"
#include "command.h"
#include "command_table.h"
#include "fleet_keys.h"
#include "host_time.h"
#include "s3_client.h"
#include "s3_credentials.h"
#include "units.h"
#include "zstd_file.h"

namespace hvtrace::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr uint64_t kMaxIndexBytes = 1u << 20;
// A capture holds a region (at most a few GiB) and its decoded copies.
constexpr uint64_t kMaxObjectBytes = 16ull << 30;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

// The store options every fleet command takes.
struct StoreFlags {
  std::string endpoint, bucket, region, prefix, credentials;
  bool prefix_set = false;

  void Define(CLI::App& app) {
    app.add_option("--endpoint", endpoint,
                   "the S3 endpoint, http(s)://host[:port] ($HVTRACE_FLEET_ENDPOINT)")
        ->type_name("URL");
    app.add_option("--bucket", bucket, "the bucket ($HVTRACE_FLEET_BUCKET)")->type_name("NAME");
    app.add_option("--region", region,
                   "the SigV4 region ($HVTRACE_FLEET_REGION; default us-east-1)")
        ->type_name("NAME");
    app.add_option("--prefix", prefix,
                   "the key prefix hvtraced uploads under ($HVTRACE_FLEET_PREFIX; default hvtrace)")
        ->type_name("PREFIX");
    app.add_option("--credentials", credentials,
                   "a file with access_key = and secret_key = lines ($HVTRACE_FLEET_CREDENTIALS; "
                   "else $AWS_ACCESS_KEY_ID and $AWS_SECRET_ACCESS_KEY)")
        ->type_name("FILE");
  }

  // The client and the normalized prefix; errors say which setting is missing.
  Result<std::pair<hostd::S3Config, std::string>> Resolve() const {
    hostd::S3Config c;
    c.endpoint = !endpoint.empty() ? endpoint : Env("HVTRACE_FLEET_ENDPOINT");
    c.bucket = !bucket.empty() ? bucket : Env("HVTRACE_FLEET_BUCKET");
    c.region = !region.empty() ? region : Env("HVTRACE_FLEET_REGION");
    if (c.region.empty()) c.region = "us-east-1";
    if (c.endpoint.empty()) return Error{"no endpoint: --endpoint or $HVTRACE_FLEET_ENDPOINT"};
    if (c.bucket.empty()) return Error{"no bucket: --bucket or $HVTRACE_FLEET_BUCKET"};
    const std::string file = !credentials.empty() ? credentials : Env("HVTRACE_FLEET_CREDENTIALS");
    if (!file.empty()) {
      // The user's own file, read with the user's rights.
      auto creds = hostd::LoadS3Credentials(file, /*private_only=*/false);
      if (!creds.ok()) return creds.error();
      c.access_key = creds->access_key;
      c.secret_key = creds->secret_key;
    } else {
      c.access_key = Env("AWS_ACCESS_KEY_ID");
      c.secret_key = Env("AWS_SECRET_ACCESS_KEY");
      if (c.access_key.empty() || c.secret_key.empty()) {
        return Error{
            "no credentials: --credentials FILE, $HVTRACE_FLEET_CREDENTIALS, or "
            "$AWS_ACCESS_KEY_ID and $AWS_SECRET_ACCESS_KEY"};
      }
    }
    if (Status s = hostd::ValidateS3Config(c); !s.ok()) return s.error();
    std::string p = !prefix.empty() ? prefix : Env("HVTRACE_FLEET_PREFIX");
    if (prefix.empty() && std::getenv("HVTRACE_FLEET_PREFIX") == nullptr) p = "hvtrace";
    auto normalized = hostd::NormalizePrefix(p);
    if (!normalized.ok()) return normalized.error();
    return std::make_pair(c, *normalized);
  }
};

// --since: a UTC time (2026-11-25T04:00:00Z, 20261125T040000Z) or an age
// (2h, 30m) — as a capture id's UTC stamp, which compares as text.
Result<std::string> SinceStamp(const std::string& since) {
  if (since.empty()) return std::string();
  // An age ends in its unit; a bare number would be a date (20261125).
  const bool has_unit = std::isalpha(static_cast<unsigned char>(since.back())) &&
                        since.back() != 'Z' && since.find('T') == std::string::npos;
  auto age = has_unit ? hostd::ParseDuration(since) : Result<std::chrono::milliseconds>(Error{});
  if (age.ok()) {
    const int64_t now = hostd::HostTime::Now().realtime_ns;
    return hostd::UtcStamp(now - static_cast<int64_t>(age->count()) * 1000000);
  }
  std::string compact;
  for (char ch : since) {
    if (ch != '-' && ch != ':') compact += ch;
  }
  // 20261125T040000Z or 20261125T040000.123Z or 20261125
  if (compact.size() >= 8 && std::all_of(compact.begin(), compact.begin() + 8, ::isdigit)) {
    if (!compact.empty() && compact.back() == 'Z') compact.pop_back();
    return compact;
  }
  return Error{"--since '" + since +
               "' is neither a UTC time (2026-11-25T04:00:00Z) nor an age "
               "(2h, 30m)"};
}

struct Listed {
  hostd::FleetCaptureRef ref;
  hostd::CaptureIdParts parts;
  std::string key;
};

// The listing index, narrowed to |host| (and |vm|) when given: the key
// layout puts them first, so the store lists only those keys.
Result<std::vector<Listed>> ListIndex(hostd::S3Client& s3, const std::string& prefix,
                                      const std::string& host = "", const std::string& vm = "") {
  std::string under = hostd::IndexListPrefix(prefix);
  if (!host.empty() && hostd::ValidateObjectKey(host).ok()) {
    under += host + "/";
    if (!vm.empty() && hostd::ValidateObjectKey(vm).ok()) under += vm + "/";
  }
  auto objects = s3.List(under);
  if (!objects.ok()) return objects.error();
  std::vector<Listed> out;
  for (const hostd::S3Object& o : *objects) {
    auto ref = hostd::ParseIndexListKey(prefix, o.key);
    if (!ref) continue;  // Not ours: skipped, never trusted.
    auto parts = hostd::ParseCaptureId(ref->id);
    if (!parts) continue;
    out.push_back({*ref, *parts, o.key});
  }
  std::sort(out.begin(), out.end(), [](const Listed& a, const Listed& b) {
    return a.parts.utc != b.parts.utc ? a.parts.utc < b.parts.utc : a.key < b.key;
  });
  return out;
}

class FleetListCommand final : public Command {
 public:
  void Define(CLI::App& app) override {
    store_.Define(app);
    app.add_option("--vm", vm_, "only this VM's captures")->type_name("NAME");
    app.add_option("--host", host_, "only this host's captures")->type_name("NAME");
    app.add_option("--trigger", trigger_, "only captures of this trigger (panic, manual, …)")
        ->type_name("TRIGGER");
    app.add_option("--since", since_, "only captures since a UTC time or within an age (2h)")
        ->type_name("TIME");
    app.add_flag("--json", json_, "print each capture's index object as JSON");
  }
  int Run() override {
    auto store = store_.Resolve();
    if (!store.ok()) return Fail(store.error().message, kExitUsage);
    auto since = SinceStamp(since_);
    if (!since.ok()) return Fail(since.error().message, kExitUsage);
    hostd::S3Client s3(store->first);
    auto listed = ListIndex(s3, store->second, host_, vm_);
    if (!listed.ok()) return Fail(listed.error().message, kExitFailed);
    std::vector<Listed> shown;
    for (const Listed& l : *listed) {
      if (!vm_.empty() && l.ref.vm != vm_) continue;
      if (!host_.empty() && l.ref.host != host_) continue;
      if (!trigger_.empty() && l.parts.trigger != trigger_) continue;
      if (!since->empty() && l.parts.utc < *since) continue;
      shown.push_back(l);
    }
    if (json_) {
      // Index objects only: a few KiB each, never a capture's data.
      json out = json::array();
      for (const Listed& l : shown) {
        auto body = s3.GetBytes(l.key, kMaxIndexBytes);
        json doc = body.ok() ? json::parse(*body, nullptr, false) : json();
        if (!body.ok() || doc.is_discarded() || !doc.is_object()) {
          doc = {{"error", body.ok() ? "not a JSON object" : body.error().message}};
        }
        doc["name"] = l.ref.Name();
        out.push_back(std::move(doc));
      }
      PrintJson({{"captures", std::move(out)}});
      return kExitOk;
    }
    if (shown.empty()) {
      std::printf("no captures\n");
      return kExitOk;
    }
    std::printf("%-20s %-24s %-26s %-12s %s\n", "HOST", "VM", "TIME (UTC)", "TRIGGER", "NAME");
    for (const Listed& l : shown) {
      std::printf("%-20s %-24s %-26s %-12s %s\n", l.ref.host.c_str(), l.ref.vm.c_str(),
                  l.parts.utc.c_str(), l.parts.trigger.c_str(), l.ref.Name().c_str());
    }
    return kExitOk;
  }

 private:
  int Fail(const std::string& message, int code) const {
    std::fprintf(stderr, "hvtrace fleet list: %s\n", message.c_str());
    return code;
  }
  StoreFlags store_;
  std::string vm_, host_, trigger_, since_;
  bool json_ = false;
};

class FleetFetchCommand final : public Command {
 public:
  void Define(CLI::App& app) override {
    app.add_option("name", name_, "HOST/VM/ID as `hvtrace fleet list` prints it, or an ID alone")
        ->required();
    store_.Define(app);
    app.add_option("--to", to_, "the directory to create (default: ./ID)")->type_name("DIR");
  }
  int Run() override {
    auto store = store_.Resolve();
    if (!store.ok()) return Fail(store.error().message, kExitUsage);
    const std::string& prefix = store->second;
    hostd::S3Client s3(store->first);
    auto listed = ListIndex(s3, prefix);
    if (!listed.ok()) return Fail(listed.error().message, kExitFailed);
    std::vector<Listed> matches;
    for (const Listed& l : *listed) {
      if (l.ref.Name() == name_ || l.ref.id == name_) matches.push_back(l);
    }
    if (matches.empty()) {
      return Fail("no uploaded capture '" + name_ + "' (an upload in progress has no index yet)",
                  kExitFailed);
    }
    if (matches.size() > 1) {
      std::string names;
      for (const Listed& l : matches) names += "\n  " + l.ref.Name();
      return Fail("'" + name_ + "' names several captures; say which:" + names, kExitUsage);
    }
    const Listed& c = matches.front();
    const fs::path dir = to_.empty() ? fs::path(c.ref.id) : fs::path(to_);
    if (::mkdir(dir.c_str(), 0755) != 0) {
      return Fail("cannot create " + dir.string() + ": " + std::strerror(errno), kExitFailed);
    }
    const std::string base = hostd::CaptureKeyPrefix(prefix, c.ref);
    auto objects = s3.List(base, 10000);
    if (!objects.ok()) return Fail(objects.error().message, kExitFailed);
    uint64_t bytes = 0;
    for (const hostd::S3Object& o : *objects) {
      const std::string name = o.key.substr(base.size());
      // One file name, nothing else: the key comes from the store.
      if (name.empty() || name.find('/') != std::string::npos || name[0] == '.') continue;
      if (Status s = Download(s3, o.key, dir, name); !s.ok()) {
        return Fail(s.error().message, kExitFailed);
      }
      bytes += o.size;
    }
    std::printf("fetched %s into %s (%zu objects, %llu bytes from the store)\n",
                c.ref.Name().c_str(), dir.c_str(), objects->size(),
                static_cast<unsigned long long>(bytes));
    return kExitOk;
  }

 private:
  static Status Download(hostd::S3Client& s3, const std::string& key, const fs::path& dir,
                         const std::string& name) {
    // Only what the uploader compressed (fleet_keys.h) is unpacked; a
    // capture's own .zst files (printk-memory.zst) are stored as they are.
    const std::string stem = name.ends_with(".zst") ? name.substr(0, name.size() - 4) : "";
    if (stem.empty() || !hostd::CompressedInStore(stem)) {
      return s3.GetToFile(key, dir / name, kMaxObjectBytes);
    }
    const fs::path packed = dir / ("." + name + ".part");
    if (Status s = s3.GetToFile(key, packed, kMaxObjectBytes); !s.ok()) return s;
    Status s = hostd::DecompressFile(packed, dir / stem, kMaxObjectBytes);
    std::error_code ec;
    fs::remove(packed, ec);
    return s;
  }
  int Fail(const std::string& message, int code) const {
    std::fprintf(stderr, "hvtrace fleet fetch: %s\n", message.c_str());
    return code;
  }
  StoreFlags store_;
  std::string name_, to_;
};

}  // namespace

void AddFleetCommands(CommandTable& table) {
  CLI::App* fleet = table.AddGroup(
      "fleet", "list and fetch the captures hvtraced uploaded to an S3 bucket (no daemon needed)");
  table.Add("list", "list uploaded captures from their index objects",
            std::make_unique<FleetListCommand>(), fleet);
  table.Add("fetch", "download an uploaded capture into a directory `hvtrace show` opens",
            std::make_unique<FleetFetchCommand>(), fleet);
}

}  // namespace hvtrace::cli
