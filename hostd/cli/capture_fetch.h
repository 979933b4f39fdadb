// `hvtrace show ID` and `hvtrace show VM/ID`: a capture read through hvtraced
// instead of by path.
//
// The state dir is readable only by root and the observers' group, and an
// admin need not be in that group; the daemon, which checks the role of
// every client (access.h), hands any observer or admin read-only
// descriptors of the capture's files (the capture-files command). The
// decoders open files by path, and re-opening a passed descriptor through
// /proc/self/fd checks the file's permissions again, so the files are copied
// into a private temporary directory (0700, removed afterwards) and shown
// from there. The raw region copies (region.bin, region.attach; up to the
// size of the guest's range) are copied only when the capture has no
// trace.dat, the one case `show` decodes them.
#ifndef HVTRACE_HOSTD_CLI_CAPTURE_FETCH_H_
#define HVTRACE_HOSTD_CLI_CAPTURE_FETCH_H_

#include <filesystem>
#include <string>

namespace hvtrace::cli {

// Whether |arg| names a capture for hvtraced rather than a directory: no
// such path exists, and it reads ID or VM/ID (no empty, "." or ".."
// component, none starting with a dot).
bool IsCaptureReference(const std::string& arg);

// A capture copied out of hvtraced's state dir; the copy goes with it.
class FetchedCapture {
 public:
  FetchedCapture() = default;
  FetchedCapture(const FetchedCapture&) = delete;
  FetchedCapture& operator=(const FetchedCapture&) = delete;
  ~FetchedCapture();

  const std::filesystem::path& dir() const { return dir_; }
  const std::string& name() const { return name_; }  // "VM/ID", for messages.

 private:
  friend int FetchCapture(const std::string&, const std::string&, FetchedCapture*);
  std::filesystem::path root_;  // The private temporary directory.
  std::filesystem::path dir_;   // root_/ID, the capture's copy.
  std::string name_;
};

// Asks hvtraced (socket: |socket_flag|, else the default) for the capture
// |reference| and copies it into |out|. Returns an ExitCode (command.h);
// on failure the reason is on stderr, naming the capture and the user.
int FetchCapture(const std::string& reference, const std::string& socket_flag, FetchedCapture* out);

// "; read it through hvtraced: `hvtrace show VM/ID`" when |path| ends in
// vms/VM/captures/ID (a state dir this user may not read), else "".
std::string CaptureReferenceHint(const std::filesystem::path& path);

}  // namespace hvtrace::cli

#endif  // HVTRACE_HOSTD_CLI_CAPTURE_FETCH_H_
