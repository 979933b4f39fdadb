#include "vm_record.h"

#include <system_error>

#include "capped_file.h"
#include "durable_file.h"

namespace hvtrace::hostd {

Status SaveVmRecordJson(const std::filesystem::path& path, const nlohmann::json& record) {
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  return WriteFileDurably(path, record.dump(2) + "\n");
}

Result<nlohmann::json> LoadVmRecordJson(const std::filesystem::path& path) {
  // Written by hvtraced, but the state directory may have been edited.
  Result<std::string> text = ReadCappedFile(path, kVmRecordMaxBytes);
  if (!text.ok()) return Error{"no VM record: " + text.error().message};
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Error{path.string() + " is not a JSON object"};
  return j;
}

}  // namespace hvtrace::hostd
