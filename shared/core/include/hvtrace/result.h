// Result<T>: a value or an error message with context, for setup paths and
// parsers that report why they failed. shared/ throws nothing; callers decide
// whether an error is fatal.
#ifndef HVTRACE_RESULT_H_
#define HVTRACE_RESULT_H_

#include <string>
#include <utility>
#include <variant>

namespace hvtrace {

struct Error {
  std::string message;  // Says what failed and where (file, VM, CPU, offset).
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}      // NOLINT: implicit by design.
  Result(Error error) : v_(std::move(error)) {}  // NOLINT: implicit by design.

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const Error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

// Result<void>: success or an error.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : error_(std::move(error)), ok_(false) {}  // NOLINT
  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const { return error_; }

 private:
  Error error_;
  bool ok_ = true;
};

}  // namespace hvtrace

#endif  // HVTRACE_RESULT_H_
