/* Direct-write tracing for guest programs, C API. One tracer per process;
 * the design (per-thread rings in host memory, zero loss up to a crash, event
 * formats published for the host) is described in hvtrace/dwtrace.hpp.
 *
 *   struct ev { int32_t step; char what[12]; };
 *   static const struct hvt_dw_field f[] = {
 *     {"step", "int", offsetof(struct ev, step), 4, 1},
 *     {"what", "char[12]", offsetof(struct ev, what), 12, 0}};
 *   hvt_dw_open(NULL);
 *   int id = hvt_dw_register("myapp", "progress", f, 2, NULL);
 *   struct ev e = {1, "start"};
 *   hvt_dw_write(id, &e, sizeof e);
 *
 * Link with hvtrace-dwtrace (and libstdc++). All functions are thread-safe;
 * hvt_dw_write is lock-free and makes no system call. */
#ifndef HVTRACE_DWTRACE_H_
#define HVTRACE_DWTRACE_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct hvt_dw_field {
  const char* name;
  const char* type; /* C type; arrays as "char[16]" */
  uint32_t offset;  /* offsetof() in the payload struct */
  uint32_t size;
  int is_signed;
};

/* Maps the region: |region_path| NULL or "" finds it ($HVTRACE_REGION,
 * /run/hvtrace/region, then a PCI scan). 0 or -errno (-ENODEV: no region,
 * -EAGAIN: the agent has not announced the guest yet). */
int hvt_dw_open(const char* region_path);

/* Registers an event; returns its id (> 0) or -errno. |print_fmt| may be NULL. */
int hvt_dw_register(const char* system, const char* name, const struct hvt_dw_field* fields,
                    unsigned int nfields, const char* print_fmt);

/* Appends one event; 0, or -ENOSPC when it was dropped, -EBADF before open. */
int hvt_dw_write(int id, const void* payload, uint32_t size);

/* Unmaps. Threads must not write concurrently. */
void hvt_dw_close(void);

#ifdef __cplusplus
}
#endif

#endif /* HVTRACE_DWTRACE_H_ */
