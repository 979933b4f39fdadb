// The sched_switch and sched_wakeup(_new) printers: libtraceevent's
// plugin_sched_switch handlers reproduced as compiled printers (see
// event_printer.h), including their side effect of registering the comms
// they print.
#ifndef HVTRACE_SHARED_DECODE_SRC_SCHED_PRINTER_H_
#define HVTRACE_SHARED_DECODE_SRC_SCHED_PRINTER_H_

#include <memory>

#include "event_printer.h"

namespace hvtrace {

// A printer for sched_switch (|is_switch|) or sched_wakeup(_new), or null
// when |event|'s fields are not what the handler expects (libtraceevent then
// prints it).
std::unique_ptr<EventPrinter> CompileSchedPrinter(tep_handle* tep, tep_event* event,
                                                  bool is_switch);

}  // namespace hvtrace

#endif  // HVTRACE_SHARED_DECODE_SRC_SCHED_PRINTER_H_
