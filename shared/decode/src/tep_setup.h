// What a trace file says about its kernel besides its formats and symbols,
// handed to libtraceevent as trace-cmd hands it: the clock's units, the
// printk formats and the saved task names. Every input is hostile text.
#ifndef HVTRACE_SHARED_DECODE_SRC_TEP_SETUP_H_
#define HVTRACE_SHARED_DECODE_SRC_TEP_SETUP_H_

#include <string>
#include <string_view>

struct tep_handle;
struct tep_plugin_list;

namespace hvtrace {

// Whether trace-cmd prints |trace_clock|'s times as sec.usec (a clock that
// counts nanoseconds) rather than as raw counts.
bool ClockInNanoseconds(const std::string& trace_clock);
// Registers the printk_formats text's well-formed lines with |tep|.
void LoadPrintkFormats(tep_handle* tep, std::string_view text);
// Registers saved_cmdlines' "pid comm" lines with |tep|, in file order.
void LoadCmdlines(tep_handle* tep, const std::string& text);
// tep_load_plugins(tep), with libtraceevent's plugins kept loaded for the
// life of the process (free the list with tep_unload_plugins as usual).
tep_plugin_list* LoadTepPlugins(tep_handle* tep);

}  // namespace hvtrace

#endif  // HVTRACE_SHARED_DECODE_SRC_TEP_SETUP_H_
