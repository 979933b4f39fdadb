// What a trace file says about its kernel besides its formats and symbols,
// handed to libtraceevent as trace-cmd hands it: the clock's units, the
// printk formats and the saved task names. Every input is hostile text.
#ifndef HVTRACE_SHARED_DECODE_SRC_TEP_SETUP_H_
#define HVTRACE_SHARED_DECODE_SRC_TEP_SETUP_H_

#include <string>
#include <string_view>

struct tep_handle;

namespace hvtrace {

// Whether trace-cmd prints |trace_clock|'s times as sec.usec (a clock that
// counts nanoseconds) rather than as raw counts.
bool ClockInNanoseconds(const std::string& trace_clock);
// Registers the printk_formats text's well-formed lines with |tep|.
void LoadPrintkFormats(tep_handle* tep, std::string_view text);
// Registers saved_cmdlines' "pid comm" lines with |tep|, in file order.
void LoadCmdlines(tep_handle* tep, const std::string& text);

}  // namespace hvtrace

#endif  // HVTRACE_SHARED_DECODE_SRC_TEP_SETUP_H_
