// The metadata channel: what hvtrace-agent tells hvtraced about each boot of
// its guest over a virtio-serial port (QEMU virtserialport, libvirt
// <channel type='unix'> with target name kMetaPortName), so a capture of a VM
// booted from its own disk decodes with names and symbols though the host
// never had its kernel file.
//
// A byte stream of frames. Each frame is a 48-byte header (little-endian)
// followed by |stored_size| payload bytes:
//
//   +0  u32 magic          kMetaFrameMagic ("HVTM")
//   +4  u16 version        kMetaFrameVersion
//   +6  u16 type           MetaType
//   +8  u32 flags          MetaFlags
//   +12 u32 stored_size    payload bytes on the wire
//   +16 u32 raw_size       payload bytes after inflating (= stored_size when
//                          not compressed)
//   +20 u32 payload_crc32  zlib crc32 of the raw payload
//   +24 u8  boot_id[16]    /proc/sys/kernel/random/boot_id of the sending boot
//   +40 u32 sequence       per boot, +1 per frame (the host spots a gap)
//   +44 u32 header_crc32   zlib crc32 of bytes 0..43
//
// Payloads:
//   kBoot   a ustar archive: the members of a format harvest
//           (hostd/formats/formats_bundle.h: formats, header_page,
//           header_event, printk_formats, kallsyms, version, release,
//           modules) plus
//             identity.json  {"boot_id": "<uuid>", "release", "proc_version",
//                             "build_id": "<hex of the kernel's GNU build id
//                             note, /sys/kernel/notes>", "nr_cpus",
//                             "page_size", "agent_version"}
//             fingerprints   "<system>/<event> <id> <16 hex digits>\n" per
//                            event (hvtrace/fingerprint.h)
//           Sent first on each connection; the host keeps it per VM and
//           boot. Sent again, on the same connection and with sequence 0,
//           when the guest's set of events changed (a module with events
//           loaded): the host replaces the boot's bundle.
//   kComms  saved_cmdlines text ("pid comm\n" lines), whole, each time it
//           changed: task names for this boot's events.
//   kClock  JSON {"samples": [{"mono": ns, "boot": ns, "real": ns,
//           "tsc": ticks}, ...]}: clock-sync samples of this boot.
//   kLeaving  16 bytes (hvtrace/meta_leaving.h): the guest is about to leave
//           its kernel (kexec, reboot, poweroff); the agent waits, bounded,
//           for the host's kAck before it lets the shutdown go on.
//
// The host sends two types back, on the same port:
//   kHello  first on each connection: text naming the host end (at most
//           kMaxHelloRaw bytes), boot id zero. The guest sees a host come
//           and go as the port's hangup, but a host gone and back before
//           the guest's kernel handled the first of those control messages
//           (a fast daemon restart, a busy vCPU) shows no hangup at all: a
//           hello after the agent wrote on what it took for the same
//           connection tells it the boot archive must go again.
//   kAck    only in answer to a kLeaving, 16 bytes (hvtrace/meta_leaving.h).
// Each direction's decoder accepts only its direction's types
// (MetaDirection), so a guest cannot make the host parse an ack, nor a host
// make the agent buffer a boot archive.
//
// Everything the host reads here is hostile: a guest can send anything. The
// decoder bounds every size before it allocates, inflates into a hard cap,
// checks both CRCs, and after a bad header skips to the next magic (a frame
// cut by a reconnect or a guest reboot costs that frame only). Whether a
// payload's contents are true (formats that match their fingerprints, a
// build id that matches the kallsyms) is the host's next check, not this
// codec's.
#ifndef HVTRACE_META_CHANNEL_H_
#define HVTRACE_META_CHANNEL_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hvtrace/result.h"

namespace hvtrace::meta {

inline constexpr char kMetaPortName[] = "org.hvtrace.agent.0";
inline constexpr uint32_t kMetaFrameMagic = 0x4d545648;  // "HVTM" little-endian.
inline constexpr uint16_t kMetaFrameVersion = 1;
inline constexpr size_t kMetaHeaderSize = 48;

enum class MetaType : uint16_t {
  kBoot = 1,
  kComms = 2,
  kClock = 3,
  kLeaving = 4,
  kAck = 5,
  kHello = 6,
};
// Who reads the frames: hvtraced (kBoot … kLeaving) or the agent (kAck, kHello).
enum class MetaDirection { kToHost, kToGuest };
enum MetaFlags : uint32_t { kMetaCompressed = 1u << 0 };  // zlib (compress2).

// The most a frame may carry, per type, raw (after inflating). A 6.12
// distribution kernel's boot archive is ~8 MB raw (kallsyms 4.7 MB, formats
// 1.5 MB), ~1.5 MB compressed.
inline constexpr uint32_t kMaxBootRaw = 128u << 20;
inline constexpr uint32_t kMaxCommsRaw = 1u << 20;
inline constexpr uint32_t kMaxClockRaw = 64u << 10;
inline constexpr uint32_t kLeavePayloadSize = 16;  // kLeaving and kAck, exactly.
inline constexpr uint32_t kMaxHelloRaw = 256;
inline constexpr uint32_t kMaxStored = 64u << 20;

using BootId = std::array<uint8_t, 16>;

struct MetaFrame {
  MetaType type = MetaType::kBoot;
  BootId boot_id{};
  uint32_t sequence = 0;
  std::string payload;  // Raw (inflated).
};

// The frame for |payload|, zlib-compressed when |compress| (level 6).
std::vector<std::byte> EncodeMetaFrame(MetaType type, const BootId& boot_id, uint32_t sequence,
                                       std::string_view payload, bool compress);

// The kHello frame a host writes first on each connection; |host| names it.
std::vector<std::byte> EncodeHello(std::string_view host);

// Parses "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (boot_id's text form).
std::optional<BootId> ParseBootId(std::string_view text);
std::string BootIdString(const BootId& id);

// Incremental decoder for one stream (one connection, one direction). Feed
// bytes as they come; Next() returns each complete frame, or an error for a
// bad one (the error names the stream offset and why: bad magic run skipped,
// header CRC, unknown type or one of the other direction, size over its
// type's limit, payload CRC, inflate failure).
// After an error it resynchronises at the next magic. Memory is bounded by
// the largest frame allowed, never by what the guest claims.
class MetaDecoder {
 public:
  explicit MetaDecoder(MetaDirection direction = MetaDirection::kToHost) : direction_(direction) {}
  void Feed(std::span<const std::byte> bytes);
  // nullopt: need more bytes.
  std::optional<Result<MetaFrame>> Next();
  uint64_t offset() const { return consumed_; }  // Stream offset of buffer_[0].
  uint64_t skipped_bytes() const { return skipped_; }

 private:
  MetaDirection direction_;
  std::vector<std::byte> buffer_;
  size_t start_ = 0;  // First unconsumed byte of buffer_.
  uint64_t consumed_ = 0;
  uint64_t skipped_ = 0;
};

}  // namespace hvtrace::meta

#endif  // HVTRACE_META_CHANNEL_H_
