// "hvtrace-guest-test scribble MODE": a hostile guest on purpose. It maps the
// region the agent attached (or --region PATH) and damages it the ways a
// broken or malicious guest could, so tests can check that the host reports
// and skips what is bad, keeps the rest and keeps running:
//
//   lengths    slot lengths past the slot, below the page header, and a
//              CPU page whose commit runs past its slot's length
//   torn       slots left mid-write (odd seq) and a slot whose seq moves
//   backwards  ring publish counters and the heartbeat running backwards,
//              a slot claiming a page the ring never published
//   formats    format entries that lie: id vs text, fingerprint, text
//              offsets outside the area, unknown kind, unparsable text, a
//              second format for an id already taken
//   pages      direct-write pages with impossible record lengths
//   texts      symbol and comm areas that lie: text that is not symbols or
//              comms, sizes and CRCs that do not match, a compressed size
//              past the area, a zlib bomb, a write left torn
//   header     the host-written header rewritten (sizes and offsets)
//   identity   an impossible guest identity (CPU count)
//   all        everything above except identity
//
// Each action is printed ("scribble: <what> at offset N"). --repeat-ms MS
// repeats the damage every 10 ms for that long (the agent keeps writing
// over some of it); counters are run backwards and formats added once. The region id and magic are
// left alone: the agent would otherwise detach, and the point is damage it cannot see.
#ifndef HVTRACE_TESTS_GUEST_SCRIBBLE_H_
#define HVTRACE_TESTS_GUEST_SCRIBBLE_H_

namespace hvtrace::guest_test {

int ScribbleMain(int argc, char** argv);

}  // namespace hvtrace::guest_test

#endif  // HVTRACE_TESTS_GUEST_SCRIBBLE_H_
