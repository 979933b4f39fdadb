// A VM's record in the state directory (qmp_vm.json for a QEMU the daemon
// booted or adopted over QMP, libvirt_vm.json for a libvirt domain): what a
// restarted hvtraced re-adopts it from. One way to keep both: written
// durably (durable_file.h), read back bounded, never through a symlink,
// every error naming the file.
#ifndef HVTRACE_HOSTD_VM_RECORD_H_
#define HVTRACE_HOSTD_VM_RECORD_H_

#include <filesystem>
#include <nlohmann/json.hpp>

#include "hvtrace/result.h"

namespace hvtrace::hostd {

// Writes |record| as indented JSON to |path|, creating its directory.
Status SaveVmRecordJson(const std::filesystem::path& path, const nlohmann::json& record);

// The JSON object in |path| (at most kVmRecordMaxBytes).
Result<nlohmann::json> LoadVmRecordJson(const std::filesystem::path& path);

// |Record| has ToJson() and static Result<Record> FromJson(const json&).
template <class Record>
Status SaveVmRecord(const std::filesystem::path& path, const Record& record) {
  return SaveVmRecordJson(path, record.ToJson());
}

template <class Record>
Result<Record> LoadVmRecord(const std::filesystem::path& path) {
  Result<nlohmann::json> j = LoadVmRecordJson(path);
  if (!j.ok()) return j.error();
  Result<Record> record = Record::FromJson(*j);
  if (!record.ok()) return Error{path.string() + ": " + record.error().message};
  return record;
}

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_VM_RECORD_H_
