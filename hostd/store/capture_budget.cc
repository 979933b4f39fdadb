#include "capture_budget.h"

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "units.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr uint64_t kNeedSlack = 1u << 20;  // Manifest, formats notes, directory.

std::string Bytes(uint64_t n) { return std::to_string(n) + " bytes (" + SizeText(n) + ")"; }

}  // namespace

bool IsPanicTrigger(std::string_view trigger) {
  return trigger == "panic" || trigger == "panic-while-away" || trigger == "crash";
}

uint64_t CaptureDiskBytes(const fs::path& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, fs::directory_options::none, ec), end;
       !ec && it != end; it.increment(ec)) {
    struct stat st;
    if (::lstat(it->path().c_str(), &st) == 0) total += static_cast<uint64_t>(st.st_blocks) * 512;
  }
  return total;
}

Result<uint64_t> FreeBytes(const fs::path& path) {
  fs::path at = path;
  struct statvfs vfs;
  for (;;) {
    if (::statvfs(at.c_str(), &vfs) == 0) break;
    if (errno != ENOENT || !at.has_parent_path() || at.parent_path() == at) {
      return Error{"statvfs " + at.string() + ": " + std::strerror(errno)};
    }
    at = at.parent_path();
  }
  return static_cast<uint64_t>(vfs.f_bavail) * static_cast<uint64_t>(vfs.f_frsize);
}

uint64_t CaptureNeed(uint64_t region_bytes) { return 2 * region_bytes + kNeedSlack; }

json CaptureBudget::Admission::ToJson() const {
  return {{"need_bytes", need},
          {"free_bytes_before", free_before},
          {"free_bytes_after_evicting", free_after},
          {"reserve_met", reserve_met},
          {"evicted", evicted}};
}

CaptureBudget::CaptureBudget(DiskLimits limits, fs::path vms_root)
    : limits_(limits), vms_root_(std::move(vms_root)) {}

Result<std::vector<CaptureBudget::Stored>> CaptureBudget::ListAll(const CaptureStore& store,
                                                                  std::string_view vm) const {
  std::vector<std::pair<std::string, CaptureStore>> stores;
  std::error_code ec;
  if (vms_root_.empty()) {
    stores.emplace_back(std::string(vm), store);
  } else {
    for (fs::directory_iterator it(vms_root_, ec), end; !ec && it != end; it.increment(ec)) {
      std::error_code type_ec;
      if (!it->is_directory(type_ec) || it->is_symlink(type_ec)) continue;
      const std::string name = it->path().filename().string();
      if (name.empty() || name.front() == '.') continue;
      stores.emplace_back(name, CaptureStore(it->path() / "captures"));
    }
    if (ec && ec != std::errc::no_such_file_or_directory) {
      return Error{"cannot list " + vms_root_.string() + ": " + ec.message()};
    }
    const bool has_vm =
        std::any_of(stores.begin(), stores.end(), [&](const auto& s) { return s.first == vm; });
    if (!has_vm) stores.emplace_back(std::string(vm), store);
  }
  std::vector<Stored> all;
  std::map<fs::path, std::map<std::string, Known>> known;
  for (const auto& [name, s] : stores) {
    Result<std::vector<CaptureDirent>> dirents = s.ListDirents();
    if (!dirents.ok()) return dirents.error();
    const auto was = known_.find(s.dir());
    std::map<std::string, Known>& now = known[s.dir()];
    std::vector<std::pair<int64_t, Stored>> mine;  // ListingOrder, then id: oldest first.
    for (const CaptureDirent& d : *dirents) {
      const Known* cached = nullptr;
      if (was != known_.end()) {
        const auto hit = was->second.find(d.id);
        if (hit != was->second.end() && hit->second.inode == d.inode) cached = &hit->second;
      }
      Known k;
      if (cached != nullptr) {
        k = *cached;
      } else {
        const json summary = SummarizeCapture(d.id, d.dir);
        const auto trigger = summary.find("trigger");
        k = {d.inode,
             trigger != summary.end() && trigger->is_string() &&
                 IsPanicTrigger(trigger->get<std::string>()),
             ListingOrder(summary), CaptureDiskBytes(d.dir)};
        // A damaged manifest is not kept: read again next time (it may be mended).
        if (summary.contains("error")) k.inode = 0;
      }
      if (k.inode != 0) now.emplace(d.id, k);
      mine.emplace_back(
          k.order, Stored{name, d.id, d.dir, k.panic, k.bytes, k.order == INT64_MAX ? 0 : k.order});
    }
    std::sort(mine.begin(), mine.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first < b.first : a.second.id < b.second.id;
    });
    for (auto& [order, st] : mine) all.push_back(std::move(st));
  }
  known_ = std::move(known);
  return all;
}

std::vector<const CaptureBudget::Stored*> CaptureBudget::Victims(const std::vector<Stored>& all,
                                                                 std::string_view vm,
                                                                 std::string_view keep_id,
                                                                 bool others, bool panics,
                                                                 bool pinned) const {
  std::vector<const Stored*> own_cheap, other_cheap, own_panic, waiting;
  for (const Stored& s : all) {
    if (s.vm == vm && s.id == keep_id) continue;
    if (upload_pending_ && upload_pending_(s.vm, s.id)) {
      // Its only copy until the store confirms it: last, and only for a panic.
      if (pinned && (s.vm == vm ? (!s.panic || panics) : (!s.panic && others))) {
        waiting.push_back(&s);
      }
      continue;
    }
    if (s.vm == vm) {
      (s.panic ? own_panic : own_cheap).push_back(&s);
    } else if (!s.panic && others) {
      other_cheap.push_back(&s);
    }
  }
  // A VM's entries are already oldest first; other VMs' interleave by time.
  std::stable_sort(other_cheap.begin(), other_cheap.end(),
                   [](const Stored* a, const Stored* b) { return a->when < b->when; });
  std::vector<const Stored*> order = own_cheap;
  order.insert(order.end(), other_cheap.begin(), other_cheap.end());
  if (panics) order.insert(order.end(), own_panic.begin(), own_panic.end());
  order.insert(order.end(), waiting.begin(), waiting.end());
  return order;
}

namespace {

// Removes |victim|; false (with |error| set) when it cannot be removed.
bool Evict(const fs::path& dir, std::string* error) {
  std::error_code ec;
  fs::remove_all(dir, ec);
  if (ec) *error = "cannot remove " + dir.string() + ": " + ec.message();
  return !ec;
}

}  // namespace

Result<CaptureBudget::Admission> CaptureBudget::Admit(const CaptureStore& store,
                                                      std::string_view vm, std::string_view trigger,
                                                      uint64_t region_bytes) {
  std::lock_guard lock(mu_);
  const bool panic = IsPanicTrigger(trigger);
  Admission a;
  a.need = CaptureNeed(region_bytes);
  Result<uint64_t> free = FreeBytes(store.dir());
  if (!free.ok()) return free.error();
  a.free_before = a.free_after = *free;
  const bool budgets = limits_.bytes_per_vm > 0 || limits_.bytes_total > 0;
  const bool short_of_space = a.free_before < a.need + limits_.free_reserve;
  if (!budgets && !short_of_space) return a;

  Result<std::vector<Stored>> all = ListAll(store, vm);
  if (!all.ok()) return all.error();
  uint64_t vm_bytes = 0, total_bytes = 0;
  for (const Stored& s : *all) {
    total_bytes += s.bytes;
    if (s.vm == vm) vm_bytes += s.bytes;
  }
  const std::string what = "VM " + std::string(vm) + ": a '" + std::string(trigger) +
                           "' capture needs up to " + Bytes(a.need) + " in " + store.dir().string();
  std::string error;
  // Evicts from |victims| in order while |over()|; false when still over.
  auto evict_while = [&](const std::vector<const Stored*>& victims, auto over) {
    for (const Stored* v : victims) {
      if (!over()) break;
      if (!fs::exists(v->dir)) continue;  // An earlier rule took it.
      if (!Evict(v->dir, &error)) return false;
      a.evicted.push_back(v->vm + "/" + v->id);
      total_bytes -= std::min(total_bytes, v->bytes);
      if (v->vm == vm) vm_bytes -= std::min(vm_bytes, v->bytes);
      if (Result<uint64_t> now = FreeBytes(store.dir()); now.ok()) a.free_after = *now;
    }
    return !over();
  };
  const char* cheap_note = panic ? "" : " (a non-panic capture never evicts a panic capture)";
  if (limits_.bytes_per_vm > 0) {
    auto over = [&] { return vm_bytes + a.need > limits_.bytes_per_vm; };
    if (!evict_while(Victims(*all, vm, "", false, panic, panic), over) && !panic) {
      if (!error.empty()) return Error{what + ": " + error};
      return Error{what + "; VM " + std::string(vm) + " keeps " + Bytes(vm_bytes) +
                   " of captures it may not evict, capture_bytes_per_vm is " +
                   Bytes(limits_.bytes_per_vm) + ": not started" + cheap_note};
    }
  }
  if (limits_.bytes_total > 0) {
    auto over = [&] { return total_bytes + a.need > limits_.bytes_total; };
    if (!evict_while(Victims(*all, vm, "", true, panic, panic), over) && !panic) {
      if (!error.empty()) return Error{what + ": " + error};
      return Error{what + "; all VMs keep " + Bytes(total_bytes) +
                   " of captures it may not evict, capture_bytes_total is " +
                   Bytes(limits_.bytes_total) + ": not started" + cheap_note};
    }
  }
  if (a.free_after < a.need + limits_.free_reserve) {
    if (!panic) {
      return Error{what + ", which has " + Bytes(a.free_after) + " free and keeps " +
                   Bytes(limits_.free_reserve) +
                   " free (capture_free_reserve): not started; only a panic capture evicts "
                   "older captures for space"};
    }
    auto over = [&] { return a.free_after < a.need + limits_.free_reserve; };
    evict_while(Victims(*all, vm, "", true, false, true), over);
    if (!error.empty()) return Error{what + ": " + error};
    // Panic captures are never evicted for space; the capture is tried with
    // what there is (a full disk then fails it clearly, keeping a durable
    // region.bin).
    a.reserve_met = !over();
  }
  return a;
}

Result<std::vector<std::string>> CaptureBudget::Prune(const CaptureStore& store,
                                                      std::string_view vm, std::string_view trigger,
                                                      std::string_view keep_id, size_t keep) {
  std::lock_guard lock(mu_);
  std::vector<std::string> removed;
  if (keep == 0 && limits_.bytes_per_vm == 0 && limits_.bytes_total == 0) {
    return removed;
  }
  Result<std::vector<Stored>> all = ListAll(store, vm);
  if (!all.ok()) return all.error();
  const bool panic = IsPanicTrigger(trigger);
  size_t vm_count = 0;
  uint64_t vm_bytes = 0, total_bytes = 0;
  for (const Stored& s : *all) {
    total_bytes += s.bytes;
    if (s.vm == vm) {
      vm_bytes += s.bytes;
      ++vm_count;
    }
  }
  std::string error;
  auto evict_while = [&](const std::vector<const Stored*>& victims, auto over) {
    for (const Stored* v : victims) {
      if (!over()) break;
      if (!fs::exists(v->dir)) continue;
      if (!Evict(v->dir, &error)) return;
      removed.push_back(v->vm + "/" + v->id);
      total_bytes -= std::min(total_bytes, v->bytes);
      if (v->vm == vm) {
        vm_bytes -= std::min(vm_bytes, v->bytes);
        --vm_count;
      }
    }
  };
  const auto own = Victims(*all, vm, keep_id, false, panic, false);
  if (keep > 0) {
    evict_while(own, [&] { return vm_count > keep; });
  }
  if (error.empty() && limits_.bytes_per_vm > 0) {
    evict_while(own, [&] { return vm_bytes > limits_.bytes_per_vm; });
  }
  if (error.empty() && limits_.bytes_total > 0) {
    evict_while(Victims(*all, vm, keep_id, true, panic, false),
                [&] { return total_bytes > limits_.bytes_total; });
  }
  if (!error.empty()) return Error{"VM " + std::string(vm) + ": retention: " + error};
  return removed;
}

}  // namespace hvtrace::hostd
