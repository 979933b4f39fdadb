// The agent's start, as a line in the persistent boot instance: the one
// write the agent makes to a tracefs buffer that is not its own. A boot
// timeline (the host's capture of the boot range) then shows when the agent
// came up, also when the agent never reached a region or the metadata
// channel. Nothing is written when the guest has no such instance.
#ifndef HVTRACE_AGENT_BOOT_MARKER_H_
#define HVTRACE_AGENT_BOOT_MARKER_H_

#include <string>

namespace hvtrace::agent {

// "hvtrace-agent: started pid N" (no newline).
std::string BootMarkerText(long pid);

// Writes |text| and a newline to <tracefs>/instances/<instance>/trace_marker.
// Returns false, touching nothing, when that instance does not exist (or
// |instance| is empty or not one plain name); false when the write fails.
bool WriteBootMarker(const std::string& tracefs, const std::string& instance,
                     const std::string& text);

}  // namespace hvtrace::agent

#endif  // HVTRACE_AGENT_BOOT_MARKER_H_
