// The hvtrace region: the ivshmem shared-memory ABI between hvtraced (host)
// and hvtrace-agent plus direct-write programs (guest). Attach mode, DESIGN §3.3.
//
// hostd creates a file of a power-of-two size, writes HostHeader (geometry)
// and HostRequests, and hot-plugs it as BAR2 of an ivshmem-plain device. The
// guest maps BAR2 and writes everything else. All fields are explicitly sized
// little-endian; offsets are from the start of the region. Host-written and
// guest-written parts never share a cache line.
//
//   +0x0000 HostHeader      host, once   magic, version, region size/id, and
//                                        the geometry of every area below
//   +0x0100 HostRequests    host         request_seq, pump interval, events
//                                        wanted, snapshot_seq, stop
//   +0x0900 GuestIdentity   guest        seqlocked: boot id, boot generation,
//                                        kernel release, CPUs, trace clock
//   +0x0A00 GuestStatus     guest        state, heartbeat, request acks,
//                                        last push time, loss window
//   +0x0A80 ClockSync[16]   guest        seqlocked {mono, boottime, realtime,
//                                        tsc} samples, written round robin
//   +0x1000 format area     guest        FormatTableHeader, FormatEntry[n],
//   (format_offset)                      then format text (system + format)
//   symbol_offset           guest        TextAreaHeader + the guest kernel's
//   (v1.1, may be absent)                text symbols (/proc/kallsyms lines),
//                                        zlib-compressed, seqlocked
//   comm_offset             guest        TextAreaHeader + saved_cmdlines
//   (v1.1, may be absent)                ("pid comm" lines), zlib, seqlocked
//   cpu_offset              guest        per CPU, cpu_stride bytes each:
//                                          CpuRingHeader, SlotDesc[slots],
//                                          pad to slot_size,
//                                          slots x slot_size pages
//   dw_offset               guest        per direct-write ring, dw_stride each:
//                                          DwRingHeader, SlotDesc[dw_slots],
//                                          pad to slot_size,
//                                          dw_slots x slot_size pages
//   region_size
//
// Pages are kernel ring-buffer sub-buffers (hvtrace/page.h). CPU slots hold
// what trace_pipe_raw returned, laid out as the guest's events/header_page
// says (published in the format table). Direct-write pages always use the
// 64-bit layout: u64 time_stamp @0, u64 commit @8, data @16.
//
// Publish protocol (seqlock). Every slot and format entry has a |seq|: the
// writer stores an odd value, fences (release), writes the content, then
// stores the next even value (release). A reader copies |seq|, the content,
// then |seq| again; only an even, unchanged |seq| means a complete copy. For a
// paused VM one look suffices: odd means the write was cut short (torn).
// CPU slots are written whole. A direct-write slot is *open* while its thread
// appends to it: the thread writes an event past |length|, then stores the new
// |length| (release), so every event whose write returned is visible; a
// reader takes the first |length| bytes. |seq| changes only when the slot is
// recycled for a new page.
//
// Text areas (minor version 1): the guest kernel's symbols and task names,
// which the host needs to print %ps/%pS pointers and comms as the guest's own
// trace file does, and which it cannot know for a VM it did not boot. Each is
// one seqlocked blob the agent replaces whole. Their size (0 = absent) is in
// HostHeader's former reserved bytes, so a 1.0 host offers none and a 1.0
// agent leaves them empty: either way the host prints hex and <...>.
//
// Sizes come from what hostd created, never from the guest: the host reader
// validates against the geometry it chose and the size of its own file. The
// guest may scribble over anything, the host header included.
//
// The magic is stored xor'd with kRegionMagicXor (as lttng-crash does), so
// memory scans for the region do not hit the constants in our binaries.
#ifndef HVTRACE_REGION_H_
#define HVTRACE_REGION_H_

#include <cstddef>
#include <cstdint>

namespace hvtrace::region {

// "HVTRACE\0" "REGION1\0" as two little-endian u64, xor'd with kRegionMagicXor
// (see above). Writers and checkers xor at run time.
inline constexpr uint64_t kRegionMagicXored[2] = {0x5370a4fc788db7f1ULL, 0x4a8e9cb2a4e1e0deULL};
inline constexpr uint64_t kRegionMagicXor[2] = {0x5335e7bd2ad9e1b9ULL, 0x4abfd2fdeda6a58cULL};

inline constexpr uint16_t kVersionMajor = 1;  // Incompatible layout changes.
inline constexpr uint16_t kVersionMinor = 1;  // Compatible additions (1: text areas).

inline constexpr uint32_t kCacheLine = 64;
inline constexpr uint64_t kMinRegionSize = 1ULL << 20;
inline constexpr uint64_t kMaxRegionSize = 1ULL << 34;
inline constexpr uint32_t kMinSlotSize = 4096;
inline constexpr uint32_t kMaxSlotSize = 1 << 16;
inline constexpr uint32_t kMaxCpus = 1024;
inline constexpr uint32_t kMaxDwRings = 4096;

// Fixed offsets of the control area (first 4 KiB).
inline constexpr uint64_t kHostHeaderOffset = 0x0000;
inline constexpr uint64_t kHostRequestsOffset = 0x0100;
inline constexpr uint64_t kGuestIdentityOffset = 0x0900;
inline constexpr uint64_t kGuestStatusOffset = 0x0A00;
inline constexpr uint64_t kClockSyncOffset = 0x0A80;
inline constexpr uint32_t kClockSyncCount = 16;
inline constexpr uint64_t kControlAreaSize = 0x1000;

// Direct-write event ids are kDwFirstEventId + FormatTableHeader::next_dw_id
// (a shared fetch-add), below 0x10000 as trace_entry's u16 type requires;
// kernel ids stay far below.
inline constexpr uint32_t kDwFirstEventId = 0xC000;

// Written once by hostd before the device is plugged. The guest checks it and
// bounds everything it maps by it; the host reader compares it with the
// geometry it remembers and reports a mismatch.
struct HostHeader {
  uint64_t magic[2];  // kRegionMagicXored ^ kRegionMagicXor, per word.
  uint16_t version_major;
  uint16_t version_minor;
  uint32_t header_size;      // sizeof(HostHeader)
  uint64_t region_size;      // Size of the file hostd created (power of two).
  uint64_t region_id;        // Random, per created region.
  uint64_t created_unix_ns;  // Host CLOCK_REALTIME at creation.
  uint32_t slot_size;        // Page size of every slot (power of two).
  uint32_t max_cpus;         // CPU rings in the region.
  uint32_t slots_per_cpu;
  uint32_t format_entries;    // FormatEntry capacity.
  uint64_t format_offset;     // FormatTableHeader, entries, text.
  uint32_t format_text_size;  // Bytes of format text after the entries.
  uint32_t dw_rings;          // Direct-write rings.
  uint64_t cpu_offset;        // First CPU ring (slot_size aligned).
  uint64_t cpu_stride;        // Bytes per CPU ring.
  uint64_t dw_offset;         // First direct-write ring (slot_size aligned).
  uint64_t dw_stride;         // Bytes per direct-write ring.
  uint32_t dw_slots;          // Pages per direct-write ring.
  uint32_t host_flags;        // Reserved, 0.
  // Minor version 1; all 0 in a 1.0 region (no text areas).
  uint64_t symbol_offset;  // TextAreaHeader + symbols (slot_size aligned).
  uint32_t symbol_size;    // Bytes of the symbol area, header included; 0: none.
  uint32_t comm_size;      // Bytes of the comm area, header included; 0: none.
  uint64_t comm_offset;    // TextAreaHeader + comms (slot_size aligned).
  uint8_t reserved[112];
};
static_assert(sizeof(HostHeader) == 256);
static_assert(offsetof(HostHeader, cpu_offset) == 80);
static_assert(offsetof(HostHeader, symbol_offset) == 120);

enum RequestFlags : uint32_t {
  kRequestStop = 1u << 0,       // Stop pumping and disable what we enabled.
  kRequestMonoClock = 1u << 1,  // Switch the kernel trace clock to "mono".
};

inline constexpr uint32_t kEventsTextSize = 1984;

// Written by hostd at any time. The host writes the fields, then bumps
// |request_seq| (release); the agent acknowledges in GuestStatus.
struct HostRequests {
  uint64_t request_seq;
  uint32_t pump_interval_ms;  // Push partial pages at least this often.
  uint32_t flags;             // RequestFlags.
  uint64_t snapshot_seq;      // Bump to ask for an immediate push.
  uint32_t events_len;        // Bytes used in |events|.
  uint32_t reserved0;
  uint8_t reserved[32];
  // Events wanted, "system:event" or "system:*", separated by ',' or '\n'.
  char events[kEventsTextSize];
};
static_assert(sizeof(HostRequests) == 2048);
static_assert(kHostRequestsOffset + sizeof(HostRequests) <= kGuestIdentityOffset);

enum TraceClock : uint32_t {
  kClockUnknown = 0,
  kClockLocal = 1,   // Kernel "local" (sched_clock): events only.
  kClockMono = 2,    // CLOCK_MONOTONIC (kernel "mono").
  kClockTsc = 3,     // Raw TSC (kernel "x86-tsc"); ClockSync relates it.
  kClockBoot = 4,    // CLOCK_BOOTTIME (kernel "boot").
  kClockGlobal = 5,  // Kernel "global".
};

// Guest identity, seqlocked by |seq| (odd while the agent rewrites it).
struct GuestIdentity {
  uint64_t seq;
  uint64_t boot_generation;  // 1 on the first boot seen; +1 per boot/kexec.
  uint8_t boot_id[16];       // /proc/sys/kernel/random/boot_id as bytes.
  char kernel_release[64];   // uname -r, NUL padded.
  uint32_t nr_cpus;          // CPUs the guest pumps (<= max_cpus).
  uint32_t agent_version;
  uint32_t trace_clock;  // TraceClock of the kernel pages.
  uint32_t page_size;    // Sub-buffer size trace_pipe_raw returns.
  uint32_t agent_pid;
  uint32_t reserved0;
  uint64_t attach_mono_ns;  // Guest CLOCK_MONOTONIC when the agent attached.
  uint8_t reserved[128];
};
static_assert(sizeof(GuestIdentity) == 256);
static_assert(kGuestIdentityOffset + sizeof(GuestIdentity) <= kGuestStatusOffset);

enum GuestState : uint32_t {
  kStateNone = 0,
  kStateAttaching = 1,
  kStateRunning = 2,
  kStateStopped = 3,   // Host asked to stop.
  kStateDetached = 4,  // Agent saw the device go.
  kStateError = 5,     // See |last_errno|.
};

// Guest status, rewritten on every pump tick.
struct GuestStatus {
  uint32_t state;  // GuestState.
  int32_t last_errno;
  uint64_t heartbeat;  // +1 per tick.
  uint64_t heartbeat_mono_ns;
  uint64_t request_ack;   // Last HostRequests::request_seq applied.
  uint64_t snapshot_ack;  // Last snapshot_seq pushed.
  // End of the last pump round; also stamped before each page is published,
  // so no page in the rings is newer, even after a panic mid-round.
  uint64_t last_push_mono_ns;
  uint64_t max_push_gap_ns;  // Largest gap between pushes: the loss window.
  uint64_t pages_pushed;
  uint64_t events_enabled;
  uint64_t dw_rings_exhausted;  // Direct-write events dropped: no free ring.
  uint32_t clock_sync_count;    // ClockSync samples written (next = count % 16).
  uint32_t symbols_state;       // SymbolsState (minor version 1).
  uint64_t reserved[5];
};
static_assert(sizeof(GuestStatus) == 128);

// What the agent did about the symbol area (GuestStatus::symbols_state).
enum SymbolsState : uint32_t {
  kSymbolsPending = 0,  // Not yet (reading and compressing takes a while), or a 1.0 agent.
  kSymbolsPublished = 1,
  kSymbolsRestricted = 2,  // /proc/kallsyms shows zero addresses (kptr_restrict).
  kSymbolsTooLarge = 3,    // Compressed, they do not fit the area.
  kSymbolsNoArea = 4,      // The host offered no symbol area.
  kSymbolsUnreadable = 5,  // /proc/kallsyms could not be read.
};

// One clock-sync sample: the same instant in every guest clock.
struct ClockSync {
  uint64_t seq;
  uint64_t mono_ns;
  uint64_t boottime_ns;
  uint64_t realtime_ns;
  uint64_t tsc;
  uint64_t reserved[3];
};
static_assert(sizeof(ClockSync) == 64);
static_assert(kClockSyncOffset + kClockSyncCount * sizeof(ClockSync) <= kControlAreaSize);

// At format_offset. Writers claim an entry and text with atomic fetch-adds on
// shared memory, so the agent and direct-write programs can add formats
// without talking to each other.
struct FormatTableHeader {
  uint32_t entry_count;  // Claimed entries (may exceed capacity: then dropped).
  uint32_t text_used;    // Claimed text bytes (likewise).
  uint32_t dropped;      // Formats that did not fit.
  uint32_t next_dw_id;   // Direct-write ids handed out: id = kDwFirstEventId + n.
  uint32_t reserved[12];
};
static_assert(sizeof(FormatTableHeader) == 64);

enum FormatKind : uint16_t {
  kFormatNone = 0,
  kFormatKernelEvent = 1,  // events/<system>/<name>/format of the guest kernel.
  kFormatDwEvent = 2,      // A direct-write event, same text syntax.
  kFormatHeaderPage = 3,   // events/header_page (system "ftrace").
  kFormatHeaderEvent = 4,  // events/header_event (system "ftrace").
};

// One published format. The text at |text_offset| (from the start of the text
// area) is |system_len| bytes of system name followed by the format text;
// |text_len| covers both. |fingerprint| is hvtrace/fingerprint.h's of the
// parsed format (0 for header files).
struct FormatEntry {
  uint32_t seq;              // Seqlock; even and non-zero once published.
  uint32_t boot_generation;  // Boot that published it.
  uint32_t id;               // Event id the pages use.
  uint16_t kind;             // FormatKind.
  uint16_t system_len;
  uint64_t fingerprint;
  uint32_t text_offset;
  uint32_t text_len;
};
static_assert(sizeof(FormatEntry) == 32);

// Head of a text area (symbols or comms), followed by |stored_size| bytes.
// The writer stores an odd |seq|, writes the bytes and the other fields,
// then the next even |seq| (region.h's seqlock); it rewrites the area only
// when its text changed. The host inflates at most |raw_size| bytes (bounded
// by its own limit) and accepts the text only if the sizes, the CRC and the
// line syntax all hold.
enum TextEncoding : uint32_t {
  kTextZlib = 1,  // RFC 1950 zlib stream.
};
struct TextAreaHeader {
  uint64_t seq;
  uint64_t boot_generation;  // Boot whose symbols/comms these are.
  uint32_t encoding;         // TextEncoding.
  uint32_t raw_size;         // Bytes of text once inflated.
  uint32_t stored_size;      // Bytes after this header.
  uint32_t crc32;            // zlib crc32 of the raw text.
  uint64_t lines;            // Symbols or tasks: informational.
  uint64_t reserved[3];
};
static_assert(sizeof(TextAreaHeader) == 64);

// Head of each CPU ring, guest-written.
struct CpuRingHeader {
  uint64_t published;    // Pages pushed so far = next |sequence|.
  uint64_t lost_events;  // Missed events the kernel reported in pages.
  uint64_t overrun;      // per_cpu/cpuN/stats "overrun" at the last push.
  uint64_t read_errors;
  uint32_t cpu;
  uint32_t online;  // 1 while the agent pumps this CPU.
  uint64_t reserved[3];
};
static_assert(sizeof(CpuRingHeader) == 64);

enum SlotFlags : uint32_t {
  kSlotPartial = 1u << 0,  // The kernel handed out a page still being filled.
  kSlotOpen = 1u << 1,     // Direct-write: the thread still appends here.
};

// Describes one page slot; slot i of a ring holds the page whose |sequence|
// is congruent to i modulo the ring's slot count.
struct SlotDesc {
  uint64_t seq;       // Seqlock; 0 = never written.
  uint64_t sequence;  // Per-ring page number, from 0.
  uint32_t boot_generation;
  uint32_t length;  // Bytes of the page that are valid (header incl.).
  uint32_t flags;   // SlotFlags.
  // Direct-write: TraceClock of this page's time stamps. A ring outlives
  // its threads, and the next owner may stamp with another clock than the
  // pages the last one left; 0 (writers before this field): the ring's
  // DwRingHeader::clock.
  uint32_t clock;
};
static_assert(sizeof(SlotDesc) == 32);

// Head of each direct-write ring. A thread owns a ring by swapping |owner|
// from 0 to its token (boot generation << 32 | tid); it then is the ring's
// only writer. The agent frees rings whose thread is gone.
struct DwRingHeader {
  uint64_t owner;
  uint32_t pid;
  uint32_t tid;
  uint32_t boot_generation;
  uint32_t clock;        // TraceClock of the time stamps.
  uint64_t published;    // Pages begun = next |sequence|.
  uint64_t lost_events;  // Events dropped (too large for a page).
  char comm[16];         // Thread name, NUL padded.
  uint64_t claims;       // Times the ring was claimed (ring reuse).
  uint64_t reserved[8];
};
static_assert(sizeof(DwRingHeader) == 128);

}  // namespace hvtrace::region

#endif  // HVTRACE_REGION_H_
