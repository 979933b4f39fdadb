#include "qemu_trace_guard.h"

#include <sys/stat.h>

#include <string>

#include "boot_trace.h"

namespace hvtrace::hostd {

using nlohmann::json;

QemuTraceGuard::QemuTraceGuard(boost::asio::any_io_executor io, std::filesystem::path log,
                               uint64_t limit, std::chrono::milliseconds period,
                               std::shared_ptr<QmpClient> qmp, Report report)
    : timer_(io),
      log_(std::move(log)),
      limit_(limit),
      period_(period),
      qmp_(std::move(qmp)),
      report_(std::move(report)) {}

void QemuTraceGuard::Start() { Arm(); }

void QemuTraceGuard::Stop() {
  // The timer is left to fire (or to go with the guard): it belongs to the
  // I/O thread, and Stop may run on another.
  std::lock_guard lock(mu_);
  report_ = nullptr;
}

void QemuTraceGuard::Arm() {
  timer_.expires_after(period_);
  timer_.async_wait([self = weak_from_this()](const boost::system::error_code& ec) {
    auto guard = self.lock();
    if (!ec && guard) guard->Check();
  });
}

void QemuTraceGuard::Check() {
  {
    std::lock_guard lock(mu_);
    if (!report_) return;
  }
  struct stat st {};
  // lstat: the daemon made a regular file; anything else is not grown by QEMU.
  const bool over = ::lstat(log_.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
                    static_cast<uint64_t>(st.st_size) > limit_;
  if (!over) {
    Arm();
    return;
  }
  for (const std::string& event : BootTraceEvents()) {
    qmp_->AsyncExecute("trace-event-set-state", {{"name", event}, {"enable", false}},
                       std::chrono::seconds(5), [](Result<json>) {});
  }
  std::lock_guard lock(mu_);
  if (tripped_ || !report_) return;
  tripped_ = true;
  report_(VmEvent{kEventQemuTraceOff,
                  {{"bytes", static_cast<uint64_t>(st.st_size)},
                   {"limit", limit_},
                   {"log", log_.string()},
                   {"why",
                    "QEMU's trace log passed its limit: hvtraced asked QEMU to turn its "
                    "trace events off; the log keeps what it has"}},
                  HostTime::Now()});
}

}  // namespace hvtrace::hostd
