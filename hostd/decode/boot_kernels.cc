#include "boot_kernels.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>

#include "formats_cache.h"
#include "hvtrace/format.h"
#include "parsed_formats.h"

namespace hvtrace::hostd {

using nlohmann::json;

namespace {

double MsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

constexpr std::string_view kBanner = "Linux version ";
constexpr uint64_t kMaxConsoleRead = 32ull << 20;
constexpr size_t kMaxMisfitsInManifest = 16;
constexpr size_t kBannersInManifest = 8;
constexpr size_t kMaxBannerInManifest = 512;

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' '))
    s.remove_suffix(1);
  while (!s.empty() && (s.front() == ' ' || s.front() == '\r')) s.remove_prefix(1);
  return s;
}

// "[    0.000000] " (the printk time of the first message); true and |rest|
// after it when |line| starts so.
bool TimeZeroPrefix(std::string_view line, std::string_view* rest) {
  if (line.empty() || line.front() != '[') return false;
  const size_t close = line.find(']');
  if (close == std::string_view::npos || close > 20) return false;
  std::string_view stamp = Trim(line.substr(1, close - 1));
  while (!stamp.empty() && stamp.front() == ' ') stamp.remove_prefix(1);
  if (stamp.empty() || stamp.find_first_not_of("0.") != std::string_view::npos) return false;
  *rest = Trim(line.substr(close + 1));
  return true;
}

// What a parsed format says about the records its id may have.
struct Shape {
  bool parsed = false;
  std::string error;
  uint32_t min_end = 0;    // End of the last scalar field: every record holds it.
  uint32_t fixed_end = 0;  // End of every fixed field (arrays included).
  bool open_tail = false;  // Dynamic or open-ended data follows.
  std::vector<std::pair<uint32_t, bool>> locs;  // __data_loc / __rel_loc (true) slots.
};

Shape ShapeOf(const KernelFormats& formats, const CachedEventFormat& ev) {
  Shape s;
  if (!ev.parse_error.empty()) {
    s.error = "its format did not parse: " + ev.parse_error;
    return s;
  }
  const ParsedFormat parsed = ParsedFormatOf(formats, ev);
  const Result<EventFormat>& f = *parsed;
  if (!f.ok()) {
    s.error = "its format does not parse: " + f.error().message;
    return s;
  }
  s.parsed = true;
  for (const FieldFormat& field : f->fields) {
    const uint32_t end = field.offset + field.size;
    s.fixed_end = std::max(s.fixed_end, end);
    if (field.kind == FieldKind::kScalar) s.min_end = std::max(s.min_end, end);
    if (field.kind == FieldKind::kDataLoc || field.kind == FieldKind::kRelLoc) {
      s.min_end = std::max(s.min_end, end);
      s.open_tail = true;
      s.locs.emplace_back(field.offset, field.kind == FieldKind::kRelLoc);
    }
    if (field.kind == FieldKind::kArray && field.array_length == 0) s.open_tail = true;
  }
  return s;
}

uint32_t Load32(std::span<const std::byte> p, uint32_t at) {
  uint32_t v = 0;
  std::memcpy(&v, p.data() + at, sizeof(v));
  return v;
}

// Empty when |payload| fits |shape|, else why not.
std::string Misfit(const Shape& shape, std::span<const std::byte> payload) {
  const uint64_t size = payload.size();
  if (size < shape.min_end) {
    return "a record of " + std::to_string(size) + " bytes is shorter than the format's fields (" +
           std::to_string(shape.min_end) + " bytes)";
  }
  const uint64_t struct_max = (uint64_t{shape.fixed_end} + 7) & ~uint64_t{7};
  if (!shape.open_tail && size > struct_max) {
    return "a record of " + std::to_string(size) + " bytes is longer than the format's struct (" +
           std::to_string(struct_max) + " bytes) and the format has no dynamic field";
  }
  for (const auto& [at, relative] : shape.locs) {
    if (uint64_t{at} + 4 > size) continue;  // Checked by min_end.
    const uint32_t v = Load32(payload, at);
    const uint64_t off = (v & 0xffffu) + (relative ? uint64_t{at} + 4 : 0);
    const uint64_t len = v >> 16;
    if (off + len > size) {
      return "a dynamic field at offset " + std::to_string(at) + " points past the record (" +
             std::to_string(off) + "+" + std::to_string(len) + " > " + std::to_string(size) + ")";
    }
  }
  return {};
}

std::string FileTail(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size <= 0) return {};
  const std::streamoff take = std::min<std::streamoff>(size, kMaxConsoleRead);
  in.seekg(size - take);
  std::string text(static_cast<size_t>(take), '\0');
  in.read(text.data(), take);
  text.resize(static_cast<size_t>(in.gcount()));
  return text;
}

}  // namespace

std::vector<std::string> ConsoleBanners(std::string_view text, size_t max_banners) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    // A banner may follow other output on the same console line (a panic
    // message without a newline, "\r"): look for the time stamp anywhere.
    const size_t at = line.find(kBanner);
    if (at == std::string_view::npos) continue;
    const size_t open = line.rfind('[', at);
    std::string_view rest;
    if (open == std::string_view::npos || !TimeZeroPrefix(line.substr(open), &rest)) continue;
    if (rest.substr(0, kBanner.size()) != kBanner) continue;
    out.emplace_back(Trim(rest));
  }
  if (out.size() > max_banners) out.erase(out.begin(), out.end() - max_banners);
  return out;
}

std::filesystem::path ConsoleLogOfMetaDir(const std::filesystem::path& meta_dir) {
  if (meta_dir.empty()) return {};
  return meta_dir.parent_path() / "console.log";
}

std::vector<std::string> ReadConsoleBanners(const std::filesystem::path& console_log) {
  if (console_log.empty()) return {};
  std::string text;
  for (int n = 3; n >= 1; --n) {
    text += FileTail(console_log.string() + "." + std::to_string(n));
    text += '\n';
  }
  text += FileTail(console_log);
  return ConsoleBanners(text);
}

uint64_t FormatsFit::misfit_id_records() const {
  uint64_t n = 0;
  for (const auto& [id, m] : misfits) n += m.id_records;
  return n;
}

json FormatsFit::ToJson() const {
  json j = {
      {"records", records}, {"ids", ids}, {"misfit_records", misfit_records}, {"passed", ok()}};
  if (!misfits.empty()) {
    json list = json::array();
    for (const auto& [id, m] : misfits) {
      if (list.size() == kMaxMisfitsInManifest) break;
      list.push_back(
          {{"id", id}, {"records", m.records}, {"id_records", m.id_records}, {"why", m.reason}});
    }
    j["misfit_ids"] = misfits.size();
    j["misfit_id_records"] = misfit_id_records();
    j["misfits"] = std::move(list);
  }
  return j;
}

FormatsFit FitRecords(std::span<const BootMapRecord* const> records, const KernelFormats& formats) {
  // Flat tables by 16-bit id: a tree lookup and a set insert per record were
  // half of this function's instructions at a panic (callgrind, 6.12 guest).
  std::vector<const CachedEventFormat*> by_id;
  for (const CachedEventFormat& ev : formats.events) {
    if (ev.id == 0 || ev.id > 0xffff) continue;
    if (by_id.size() <= ev.id) by_id.resize(ev.id + 1);
    if (by_id[ev.id] == nullptr) by_id[ev.id] = &ev;  // The first of an id, as before.
  }
  std::vector<uint32_t> slot(0x10000, 0);  // 1 + the id's index in |shapes|; 0: not seen.
  std::vector<Shape> shapes;
  FormatsFit fit;
  for (const BootMapRecord* rec : records) {
    ++fit.records;
    uint16_t type = 0;
    if (rec->payload.size() >= sizeof(type)) std::memcpy(&type, rec->payload.data(), sizeof(type));
    if (slot[type] == 0) {
      Shape s;
      if (type >= by_id.size() || by_id[type] == nullptr) {
        s.error = "no event has this id in these formats";
      } else {
        s = ShapeOf(formats, *by_id[type]);
      }
      shapes.push_back(std::move(s));
      slot[type] = static_cast<uint32_t>(shapes.size());
    }
    const Shape& shape = shapes[slot[type] - 1];
    std::string why = shape.parsed ? Misfit(shape, rec->payload) : shape.error;
    if (why.empty()) continue;
    ++fit.misfit_records;
    FormatsFit::Misfit& m = fit.misfits[type];
    if (m.reason.empty()) m.reason = std::move(why);
    ++m.records;
  }
  fit.ids = shapes.size();
  if (!fit.misfits.empty()) {
    for (const BootMapRecord* rec : records) {
      uint16_t type = 0;
      if (rec->payload.size() >= sizeof(type)) std::memcpy(&type, rec->payload.data(), 2);
      auto m = fit.misfits.find(type);
      if (m != fit.misfits.end()) ++m->second.id_records;
    }
  }
  return fit;
}

BootKernels::BootKernels(std::span<const std::byte> copy, const KernelFormats* layout,
                         FormatsService* service, std::vector<std::string> banners,
                         const BootMapCaptureOptions& capture)
    : layout_(layout), service_(service), banners_(std::move(banners)) {
  const auto start = std::chrono::steady_clock::now();
  BootMapOptions& options = map_options_;
  options.cpus = capture.cpus;
  options.threads = kDecodeThreads;
  options.layout = PageLayout::Default(capture.subbuf_size);
  if (layout != nullptr) {
    if (Result<PageLayout> pl =
            PageLayout::FromHeaderPage(layout->header_page, capture.subbuf_size);
        pl.ok()) {
      options.layout = *pl;
    }
  }
  Result<BootMap> map = ReadBootMap(copy, options);
  if (!map.ok()) {
    map_error_ = map.error().message;
    return;
  }
  map_ = std::move(*map);
  by_boot_.resize(std::max<uint32_t>(map_.boots, 1));
  for (const BootMapCpu& c : map_.cpu) {
    for (const BootMapRecord& rec : c.records) {
      by_boot_[std::min<size_t>(rec.boot, by_boot_.size() - 1)].push_back(&rec);
    }
  }
  read_ms_ = MsSince(start);
}

void BootKernels::LendMap(BootMapCaptureOptions& options) const {
  options.map = map_error_.empty() ? &map_ : nullptr;
  options.map_read_with = map_options_;
}

std::span<const BootMapRecord* const> BootKernels::RecordsOf(uint32_t boot) const {
  if (boot >= by_boot_.size()) return {};
  return by_boot_[boot];
}

std::optional<BootKernels::Candidate> BootKernels::CandidateFor(const std::string& banner) {
  auto it = candidates_.find(banner);
  if (it != candidates_.end()) return it->second;
  const auto start = std::chrono::steady_clock::now();
  std::optional<Candidate> found;
  if (service_ != nullptr && !service_->root().empty()) {
    std::vector<std::string> problems;
    Result<std::vector<CacheEntrySummary>> list = service_->Entries(&problems);
    for (const std::string& p : problems) cache_problems_.push_back(p);
    if (list.ok()) {
      for (const CacheEntrySummary& e : *list) {
        if (Trim(e.proc_version) != banner) continue;
        Result<std::shared_ptr<const KernelFormats>> got = service_->Get(e.key);
        if (!got.ok()) {
          cache_problems_.push_back(e.key + ": " + got.error().message);
          continue;
        }
        if (*got) {
          found = Candidate{e.key, *got};
          break;
        }
      }
    } else {
      cache_problems_.push_back(list.error().message);
    }
  }
  candidates_.emplace(banner, found);
  lookup_ms_ += MsSince(start);
  return found;
}

const KernelFormats* BootKernels::WithoutIds(const KernelFormats& formats, const FormatsFit& fit) {
  auto copy = std::make_unique<KernelFormats>(formats);
  std::erase_if(copy->events,
                [&](const CachedEventFormat& ev) { return fit.misfits.contains(ev.id); });
  owned_.push_back(std::move(copy));
  return owned_.back().get();
}

const KernelFormats* BootKernels::NewestIdentified() {
  if (banners_.empty()) return nullptr;
  std::optional<Candidate> c = CandidateFor(banners_.back());
  return c ? c->formats.get() : nullptr;
}

BootFormats BootKernels::For(uint32_t boot, uint32_t nboots, BootFormats fallback) {
  if (chosen_.size() < nboots) chosen_.resize(nboots, nullptr);
  if (sources_.size() < nboots) sources_.resize(nboots);
  const std::span<const BootMapRecord* const> records = RecordsOf(boot);
  // Proven for this boot: the agent's metadata for this very boot (the
  // channel's "nearest boot" stand-in is not).
  const bool proven = fallback.own_symbols && fallback.source.is_object() &&
                      fallback.source.value("from", std::string()) == "meta channel";
  json identify = json::object();
  identify["how"] = "console banner (the kernel's /proc/version, printed at time 0)";
  // Range boot i of B <-> banner N - B + i: the newest boot is the one that died.
  const int64_t index = static_cast<int64_t>(banners_.size()) - nboots + boot;
  if (!map_error_.empty()) {
    identify["result"] = "not tried: " + map_error_;
  } else if (banners_.empty()) {
    identify["result"] =
        "no banner: the VM's console log has none (not booted by hvtraced, or "
        "booted with quiet)";
  } else if (index < 0) {
    identify["result"] = "no banner for this boot: the console log has " +
                         std::to_string(banners_.size()) + " for " + std::to_string(nboots) +
                         " boots";
  } else {
    const std::string& banner = banners_[static_cast<size_t>(index)];
    identify["banner"] = banner;
    std::optional<Candidate> c = CandidateFor(banner);
    if (!c) {
      identify["result"] =
          "no formats cache entry has this /proc/version: run hvtrace formats "
          "harvest --kernel K for that kernel";
    } else {
      const auto fit_start = std::chrono::steady_clock::now();
      FormatsFit fit = FitRecords(records, *c->formats);
      check_ms_ += MsSince(fit_start);
      identify["key"] = c->key;
      identify["release"] = c->formats->release;
      identify["check"] = fit.ToJson();
      if (fit.ok() && !proven) {
        identify["result"] = "identified and checked";
        BootFormats out{c->formats.get(),
                        {},
                        false,
                        {{"from", "formats cache, identified by console banner"},
                         {"key", c->key},
                         {"release", c->formats->release},
                         {"identified", std::move(identify)}}};
        chosen_[boot] = out.formats;
        sources_[boot] = out.source;
        return out;
      }
      identify["result"] = fit.ok() ? "identified and checked; the agent's own metadata is used"
                                    : "identified but its formats do not fit the records";
    }
  }
  // The caller's choice, checked; not proven for this boot unless it is the
  // agent's metadata for this very boot (verified by its fingerprints).
  if (fallback.formats == nullptr) fallback.formats = layout_;
  const KernelFormats* f = fallback.formats;
  if (f != nullptr && map_error_.empty()) {
    const auto fit_start = std::chrono::steady_clock::now();
    FormatsFit fit = FitRecords(records, *f);
    check_ms_ += MsSince(fit_start);
    json source = fallback.source.is_object()
                      ? fallback.source
                      : json{{"from", "the capture's formats"}, {"key", f->key}};
    source["check"] = fit.ToJson();
    if (!proven) {
      source["verified"] = false;
      if (!fit.ok()) {
        fallback.formats = WithoutIds(*f, fit);
        source["note"] = std::to_string(fit.misfits.size()) +
                         " event ids do not fit these formats: their " +
                         std::to_string(fit.misfit_id_records()) +
                         " records are left undecoded (unknown ids, raw in region.bin)";
      }
    }
    source["identified"] = std::move(identify);
    fallback.source = std::move(source);
  }
  chosen_[boot] = fallback.formats;
  sources_[boot] = fallback.source;
  return fallback;
}

void BootKernels::AnnotateBoots(json& boots) const {
  if (!boots.is_array()) return;
  for (json& b : boots) {
    const uint32_t n = b.value("boot", uint32_t{0});
    if (n >= sources_.size() || !sources_[n].is_object()) continue;
    // The pipeline may have put the boot's KASLR evidence there already:
    // add the kernel's facts beside it. A record that already says where its
    // formats came from (the meta channel's boots) is kept whole.
    json& with = b["decoded_with"];
    if (!with.is_object()) with = json::object();
    if (with.contains("from")) continue;
    for (const auto& [key, value] : sources_[n].items()) {
      if (!with.contains(key)) with[key] = value;
    }
  }
}

json BootKernels::Summary() const {
  // The newest banners, so a later decode of region.bin (hvtrace show) can
  // pair boots and kernels without the VM's console.
  json newest = json::array();
  for (size_t i = banners_.size() > kBannersInManifest ? banners_.size() - kBannersInManifest : 0;
       i < banners_.size(); ++i) {
    newest.push_back(banners_[i].substr(0, kMaxBannerInManifest));
  }
  json j = {
      {"console_banners", banners_.size()},
      {"newest_banners", std::move(newest)},
      {"timing_ms", {{"read", read_ms_}, {"cache_lookup", lookup_ms_}, {"check", check_ms_}}}};
  if (!map_error_.empty()) j["error"] = map_error_;
  if (!cache_problems_.empty()) j["cache_problems"] = cache_problems_;
  return j;
}

}  // namespace hvtrace::hostd
