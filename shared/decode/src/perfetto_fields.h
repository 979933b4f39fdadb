// Perfetto's field numbers, as its .proto files publish them
// (github.com/google/perfetto, protos/perfetto/..., read 2026-12-01 at
// commit ec5d16b14b74). Only the fields hvtrace writes. Named here once so
// that perfetto_writer.cc reads as the messages it writes; the tests' reader
// (tests/unit/shared/decode/perfetto_reader.h) has its own table, taken from
// the same files, so a wrong number here fails a test.
#ifndef HVTRACE_SHARED_DECODE_SRC_PERFETTO_FIELDS_H_
#define HVTRACE_SHARED_DECODE_SRC_PERFETTO_FIELDS_H_

#include <cstdint>

namespace hvtrace::perfetto_fields {

// trace/trace.proto: message Trace.
inline constexpr uint32_t kTracePacket = 1;

// trace/trace_packet.proto: message TracePacket.
inline constexpr uint32_t kPacketFtraceEvents = 1;  // FtraceEventBundle
inline constexpr uint32_t kPacketProcessTree = 2;
inline constexpr uint32_t kPacketClockSnapshot = 6;
inline constexpr uint32_t kPacketTimestamp = 8;
inline constexpr uint32_t kPacketTrustedSequenceId = 10;
inline constexpr uint32_t kPacketTrackEvent = 11;
inline constexpr uint32_t kPacketSequenceFlags = 13;
inline constexpr uint32_t kPacketSystemInfo = 45;
inline constexpr uint32_t kPacketTimestampClockId = 58;
inline constexpr uint32_t kPacketTrackDescriptor = 60;
inline constexpr uint32_t kPacketMachineId = 98;
inline constexpr uint32_t kPacketRemoteClockSync = 107;
// TracePacket.SequenceFlags.
inline constexpr uint64_t kSeqIncrementalStateCleared = 1;

// common/system_info.proto: message SystemInfo, message Utsname.
inline constexpr uint32_t kSystemInfoUtsname = 1;
inline constexpr uint32_t kSystemInfoNumCpus = 8;
inline constexpr uint32_t kSystemInfoMachineName = 17;
inline constexpr uint32_t kUtsnameSysname = 1;
inline constexpr uint32_t kUtsnameRelease = 3;
inline constexpr uint32_t kUtsnameMachine = 4;

// trace/clock_snapshot.proto: message ClockSnapshot, ClockSnapshot.Clock,
// and common/builtin_clock.proto's BuiltinClock values.
inline constexpr uint32_t kClockSnapshotClocks = 1;
inline constexpr uint32_t kClockId = 1;
inline constexpr uint32_t kClockTimestamp = 2;
inline constexpr uint32_t kBuiltinClockRealtime = 1;
inline constexpr uint32_t kBuiltinClockBoottime = 6;
// Clock ids 64..127 are sequence-scoped (ClockSnapshot.Clock's comment);
// trace_processor's ftrace_tokenizer.cc maps FTRACE_CLOCK_LOCAL/GLOBAL
// bundles to clock 64 of their sequence (kSequenceScopedClockId).
inline constexpr uint32_t kSequenceClock = 64;

// trace/remote_clock_sync.proto: message RemoteClockSync, SyncedClocks.
inline constexpr uint32_t kRemoteClockSyncSynced = 1;
inline constexpr uint32_t kSyncedClientClocks = 2;
inline constexpr uint32_t kSyncedHostClocks = 3;

// trace/ftrace/ftrace_event_bundle.proto: message FtraceEventBundle, enum
// FtraceClock.
inline constexpr uint32_t kBundleCpu = 1;
inline constexpr uint32_t kBundleEvent = 2;
inline constexpr uint32_t kBundleLostEvents = 3;
inline constexpr uint32_t kBundleFtraceClock = 5;
inline constexpr uint32_t kBundleFtraceTimestamp = 6;
inline constexpr uint32_t kBundleBootTimestamp = 7;
inline constexpr uint64_t kFtraceClockGlobal = 2;
inline constexpr uint64_t kFtraceClockLocal = 3;

// trace/ftrace/ftrace_event.proto: message FtraceEvent.
inline constexpr uint32_t kEventTimestamp = 1;
inline constexpr uint32_t kEventPid = 2;
inline constexpr uint32_t kEventCommonFlags = 5;
inline constexpr uint32_t kEventPrint = 3;
inline constexpr uint32_t kEventSchedSwitch = 4;
inline constexpr uint32_t kEventSchedWakeup = 17;
inline constexpr uint32_t kEventSchedWaking = 20;
inline constexpr uint32_t kEventSchedWakeupNew = 114;
inline constexpr uint32_t kEventTaskNewtask = 235;
inline constexpr uint32_t kEventTaskRename = 236;
inline constexpr uint32_t kEventSchedProcessExec = 237;
inline constexpr uint32_t kEventSchedProcessExit = 238;
inline constexpr uint32_t kEventSchedProcessFork = 239;
inline constexpr uint32_t kEventSchedProcessFree = 240;
inline constexpr uint32_t kEventGeneric = 327;
inline constexpr uint32_t kEventConsole = 408;

// trace/ftrace/generic.proto: message GenericFtraceEvent, its Field.
inline constexpr uint32_t kGenericEventName = 1;
inline constexpr uint32_t kGenericField = 2;
inline constexpr uint32_t kGenericFieldName = 1;
inline constexpr uint32_t kGenericFieldStr = 3;
inline constexpr uint32_t kGenericFieldInt = 4;
inline constexpr uint32_t kGenericFieldUint = 5;

// trace/ps/process_tree.proto: message ProcessTree, ProcessTree.Thread.
inline constexpr uint32_t kProcessTreeThreads = 2;
inline constexpr uint32_t kThreadTid = 1;
inline constexpr uint32_t kThreadName = 2;
inline constexpr uint32_t kThreadTgid = 3;

// track_event/track_descriptor.proto and track_event/track_event.proto,
// debug_annotation.proto.
inline constexpr uint32_t kTrackDescriptorUuid = 1;
inline constexpr uint32_t kTrackDescriptorName = 2;
inline constexpr uint32_t kTrackEventType = 9;
inline constexpr uint32_t kTrackEventTrackUuid = 11;
inline constexpr uint32_t kTrackEventName = 23;
inline constexpr uint32_t kTrackEventDebugAnnotations = 4;
inline constexpr uint32_t kDebugAnnotationName = 10;
inline constexpr uint32_t kDebugAnnotationString = 6;
inline constexpr uint64_t kTrackEventSliceBegin = 1;
inline constexpr uint64_t kTrackEventSliceEnd = 2;
inline constexpr uint64_t kTrackEventInstant = 3;

}  // namespace hvtrace::perfetto_fields

#endif  // HVTRACE_SHARED_DECODE_SRC_PERFETTO_FIELDS_H_
