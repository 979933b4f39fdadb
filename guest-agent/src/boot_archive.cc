#include "boot_archive.h"

#include <dirent.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "clock_ns.h"
#include "hvtrace/fingerprint.h"
#include "hvtrace/format.h"
#include "text_areas.h"
#include "ustar.h"

namespace hvtrace::agent {
namespace {

// Subdirectories of |dir|, sorted (tracefs reports DT_DIR for them).
std::vector<std::string> SubDirs(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_type == DT_DIR && e->d_name[0] != '.') out.emplace_back(e->d_name);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

std::string Trimmed(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

std::string JsonString(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", c);
      out += esc;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string ReadOrEmpty(const std::string& path) {
  int error = 0;
  return ReadWholeFile(path, &error);
}

}  // namespace

std::optional<std::string> GnuBuildId(std::string_view notes) {
  constexpr uint32_t kNtGnuBuildId = 3;
  constexpr size_t kMaxBuildId = 64;  // SHA-1 ids are 20 bytes; anything longer is not one.
  auto u32 = [&](size_t off) {
    uint32_t v;
    std::memcpy(&v, notes.data() + off, sizeof v);  // Native order: the kernel's own notes.
    return v;
  };
  auto align4 = [](uint64_t n) { return (n + 3) & ~uint64_t{3}; };
  size_t off = 0;
  while (notes.size() - off >= 12) {
    const uint32_t namesz = u32(off), descsz = u32(off + 4), type = u32(off + 8);
    off += 12;
    if (align4(namesz) > notes.size() - off) return std::nullopt;
    const std::string_view name = notes.substr(off, namesz);
    off += align4(namesz);
    if (align4(descsz) > notes.size() - off) return std::nullopt;
    const std::string_view desc = notes.substr(off, descsz);
    off += align4(descsz);
    if (type != kNtGnuBuildId || name != std::string_view("GNU\0", 4)) continue;
    if (desc.empty() || desc.size() > kMaxBuildId) return std::nullopt;
    std::string hex;
    for (const char c : desc) {
      char two[3];
      std::snprintf(two, sizeof two, "%02x", static_cast<unsigned char>(c));
      hex += two;
    }
    return hex;
  }
  return std::nullopt;
}

FormatListing ListFormats(const std::string& events_dir, const std::atomic<bool>* cancel) {
  FormatListing out;
  for (const std::string& sys : SubDirs(events_dir)) {
    if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) break;
    for (const std::string& event : SubDirs(events_dir + "/" + sys)) {
      const std::string text = ReadOrEmpty(events_dir + "/" + sys + "/" + event + "/format");
      if (text.empty()) continue;
      ++out.events;
      const std::string prefix = sys + "/" + event + "/format:";
      for (size_t pos = 0; pos < text.size();) {
        size_t end = text.find('\n', pos);
        if (end == std::string::npos) end = text.size();
        out.formats += prefix;
        out.formats.append(text, pos, end - pos);
        out.formats += '\n';
        pos = end + 1;
      }
      auto parsed = ParseEventFormat(sys, text);
      if (!parsed.ok() || parsed->name != event) {
        ++out.unparsed;
        continue;
      }
      char line[64];
      std::snprintf(line, sizeof line, " %u %016llx\n", parsed->id,
                    static_cast<unsigned long long>(EventFingerprint(*parsed)));
      out.fingerprints += sys + "/" + event + line;
    }
  }
  return out;
}

BootArchive BuildBootArchive(const BootArchivePaths& paths, const std::atomic<bool>* cancel) {
  BootArchive out;
  const double t0 = MonotonicMs();
  out.boot_id_text = Trimmed(ReadOrEmpty(paths.proc + "/sys/kernel/random/boot_id"));
  if (auto id = meta::ParseBootId(out.boot_id_text)) out.boot_id = *id;
  FormatListing listing = ListFormats(paths.tracefs + "/events", cancel);
  if (cancel != nullptr && cancel->load()) {
    out.note = "boot archive: cancelled";
    return out;
  }
  const double t1 = MonotonicMs();
  utsname u{};
  uname(&u);
  const std::string version = ReadOrEmpty(paths.proc + "/version");
  const std::optional<std::string> build_id = GnuBuildId(ReadOrEmpty(paths.notes));
  std::vector<TarFile> files;
  files.push_back({"formats", std::move(listing.formats)});
  files.push_back({"header_page", ReadOrEmpty(paths.tracefs + "/events/header_page")});
  files.push_back({"header_event", ReadOrEmpty(paths.tracefs + "/events/header_event")});
  files.push_back({"printk_formats", ReadOrEmpty(paths.tracefs + "/printk_formats")});
  files.push_back({"kallsyms", ReadOrEmpty(paths.kallsyms)});
  files.push_back({"version", version});
  files.push_back({"release", std::string(u.release) + "\n"});
  files.push_back({"modules", ReadOrEmpty(paths.proc + "/modules")});
  files.push_back({"fingerprints", std::move(listing.fingerprints)});
  const std::string identity = "{\"boot_id\": " + JsonString(out.boot_id_text) +
                               ", \"release\": " + JsonString(u.release) +
                               ", \"proc_version\": " + JsonString(Trimmed(version)) +
                               ", \"build_id\": " + JsonString(build_id.value_or("")) +
                               ", \"nr_cpus\": " + std::to_string(sysconf(_SC_NPROCESSORS_CONF)) +
                               ", \"page_size\": " + std::to_string(sysconf(_SC_PAGESIZE)) +
                               ", \"agent_version\": " + JsonString(HVTRACE_VERSION) + "}\n";
  files.push_back({"identity.json", identity});
  const size_t kallsyms_size = files[4].data.size();
  out.tar = WriteUstar(files);
  const double t2 = MonotonicMs();
  out.frame = meta::EncodeMetaFrame(meta::MetaType::kBoot, out.boot_id, 0, out.tar, true);
  const double t3 = MonotonicMs();
  char note[320];
  std::snprintf(note, sizeof note,
                "boot archive: %zu event formats (%zu unparsed), kallsyms %zu bytes, build id %s; "
                "%zu bytes, %zu compressed; formats %.0f ms, rest %.0f ms, compress %.0f ms",
                listing.events, listing.unparsed, kallsyms_size,
                build_id ? build_id->c_str() : "(none)", out.tar.size(), out.frame.size(), t1 - t0,
                t2 - t1, t3 - t2);
  out.note = note;
  if (out.boot_id_text.empty()) out.note += "; no boot_id: frames carry zeros";
  return out;
}

BootArchiveSource::~BootArchiveSource() {
  cancel_.store(true);
  if (worker_.joinable()) worker_.join();
}

void BootArchiveSource::Launch() {
  done_.store(false);
  building_ = std::make_unique<BootArchive>();
  worker_ = std::thread([this, into = building_.get()] {
    *into = BuildBootArchive(paths_, &cancel_);
    done_.store(true, std::memory_order_release);
  });
}

void BootArchiveSource::Start() {
  if (started_) return;
  started_ = true;
  Launch();
}

void BootArchiveSource::Rebuild() {
  if (!started_) return;  // The first build, when it comes, reads the new set.
  if (worker_.joinable()) {
    again_ = true;
    return;
  }
  Launch();
}

bool BootArchiveSource::Poll() {
  if (!worker_.joinable() || !done_.load(std::memory_order_acquire)) return false;
  worker_.join();
  ready_ = std::move(building_);
  ++revision_;
  if (again_) {
    again_ = false;
    Launch();
  }
  return true;
}

}  // namespace hvtrace::agent
