// The layout every capture manifest has, whichever backend took it
// (hostd/store/capture_store.h): the QMP and the libvirt e2e tests check
// their captures against the same lists, so the two cannot drift apart.
#ifndef HVTRACE_TESTS_E2E_MANIFEST_LAYOUT_H_
#define HVTRACE_TESTS_E2E_MANIFEST_LAYOUT_H_

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <string>

namespace hvtrace::e2e {

inline std::set<std::string> KeysOf(const nlohmann::json& j) {
  std::set<std::string> keys;
  if (j.is_object()) {
    for (const auto& [key, value] : j.items()) keys.insert(key);
  }
  return keys;
}

// A decoded boot-range capture (formats cached) taken through |transport_kind|'s backend.
inline void ExpectBootRangeManifestLayout(const nlohmann::json& m,
                                          const std::string& transport_kind) {
  // A panic capture also says why the guest died (the crash summary from
  // the boot's kernel log) and how its printk ring was read from guest memory.
  const bool panic = m["trigger"] == "panic";
  std::set<std::string> top{"format",     "version",    "vm",     "trigger", "id",
                            "host_time",  "kernel",     "region", "cpus",    "totals",
                            "validation", "qmp_events", "files",  "extra"};
  std::set<std::string> extra{"transport",   "consistency", "timing_ms", "formats", "boots",
                              "trace_clock", "pipeline_ms", "disk",      "queue"};
  if (panic) {
    top.insert("crash");
    extra.insert("kernel_log");
  }
  EXPECT_EQ(KeysOf(m), top) << m.dump(2);
  EXPECT_EQ(m["version"], 2);
  EXPECT_EQ(KeysOf(m["region"]), (std::set<std::string>{"kind", "source", "offset", "size", "gpa"}))
      << m["region"].dump(2);
  EXPECT_EQ(KeysOf(m["extra"]), extra) << m["extra"].dump(2);
  EXPECT_EQ(KeysOf(m["extra"]["queue"]),
            (std::set<std::string>{"lane", "waited_for_a_slot", "waited_for_copy_buffers",
                                   "trigger_to_dispatch_ms", "trigger_to_worker_ms"}))
      << m["extra"]["queue"].dump(2);
  EXPECT_EQ(KeysOf(m["extra"]["disk"]),
            (std::set<std::string>{"need_bytes", "free_bytes_before", "free_bytes_after_evicting",
                                   "reserve_met", "evicted"}))
      << m["extra"]["disk"].dump(2);
  EXPECT_EQ(m["extra"]["transport"]["kind"], transport_kind);
  EXPECT_TRUE(KeysOf(m["extra"]["consistency"]).count("vcpus_stopped")) << m["extra"].dump(2);
  for (const char* key : {"trigger_to_begun", "copy", "region_write_fsync",
                          "trigger_to_region_durable", "decode", "trigger_to_decoded"}) {
    EXPECT_TRUE(m["extra"]["timing_ms"].contains(key))
        << key << " in " << m["extra"]["timing_ms"].dump();
  }
  EXPECT_TRUE(KeysOf(m["kernel"]).count("formats_key")) << m["kernel"].dump();
}

}  // namespace hvtrace::e2e

#endif  // HVTRACE_TESTS_E2E_MANIFEST_LAYOUT_H_
