#include "guest_ram_map.h"

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "units.h"

namespace hvtrace::hostd {
namespace {

using nlohmann::json;

constexpr auto kHmpTimeout = std::chrono::seconds(5);

// The steps, one HMP command at a time: the flat view, then each range's
// host address.
struct Mapping : std::enable_shared_from_this<Mapping> {
  std::shared_ptr<QmpClient> qmp;
  pid_t pid = -1;
  GuestRamDone done;
  std::vector<GuestRamRange> ranges;
  size_t next = 0;

  void Fail(const std::string& what) {
    done(Error{"guest RAM of QEMU pid " + std::to_string(pid) + ": " + what});
  }

  void Hmp(const std::string& command, std::function<void(const std::string&)> then) {
    qmp->AsyncExecute("human-monitor-command", {{"command-line", command}},
                      std::chrono::duration_cast<std::chrono::milliseconds>(kHmpTimeout),
                      [self = shared_from_this(), command, then = std::move(then)](Result<json> r) {
                        if (!r.ok()) return self->Fail("HMP " + command + ": " + r.error().message);
                        if (!r->is_string())
                          return self->Fail("HMP " + command + " answered " + r->dump());
                        then(r->get<std::string>());
                      });
  }

  void Start() {
    Hmp("info mtree -f", [self = shared_from_this()](const std::string& text) {
      Result<std::vector<GuestRamRange>> found = ParseRamFlatView(text);
      if (!found.ok()) return self->Fail(found.error().message);
      self->ranges = std::move(*found);
      self->NextHva();
    });
  }

  void NextHva() {
    if (next == ranges.size()) return Check();
    Hmp("gpa2hva " + HexText(ranges[next].gpa), [self = shared_from_this()](const std::string& t) {
      Result<uint64_t> hva = ParseGpa2Hva(t);
      if (!hva.ok()) return self->Fail(hva.error().message);
      self->ranges[self->next++].hva = *hva;
      self->NextHva();
    });
  }

  // A QEMU of another user, or one that is not dumpable, refuses here
  // (EPERM) rather than at the panic.
  void Check() {
    auto ram = std::make_shared<const GuestRam>(pid, std::move(ranges));
    std::byte probe[8];
    if (Status s = ram->Read(ram->ranges().front().gpa, probe); !s.ok()) {
      return Fail(s.error().message);
    }
    done(std::shared_ptr<const GuestRam>(std::move(ram)));
  }
};

}  // namespace

void AsyncMapGuestRam(std::shared_ptr<QmpClient> qmp, pid_t pid, GuestRamDone done) {
  auto m = std::make_shared<Mapping>();
  m->qmp = std::move(qmp);
  m->pid = pid;
  m->done = std::move(done);
  if (pid <= 0) return m->Fail("QEMU's pid is not known");
  m->Start();
}

}  // namespace hvtrace::hostd
