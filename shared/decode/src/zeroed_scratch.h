// ZeroedScratch: the zero-padded area EventDecoder stages each record in
// (decoder.cc).
#ifndef HVTRACE_SHARED_DECODE_SRC_ZEROED_SCRATCH_H_
#define HVTRACE_SHARED_DECODE_SRC_ZEROED_SCRATCH_H_

#include <sys/mman.h>

#include <cstddef>
#include <new>

namespace hvtrace {

// The zero-padded area records are staged in: fresh zero pages from mmap,
// so only the pages a record or a field reference touches are ever faulted
// in. A vector zeroed all 1.2 MB (2.4 M of the 3.6 M instructions of the
// crash summary's decoder setup, callgrind of `hvtrace show --region` on a
// 6.12 panic); calloc did the same in hvtraced, whose glibc had raised its
// mmap threshold past this size after earlier frees (0.73 M instructions of
// the crash step at each panic, callgrind, bench/README.md).
class ZeroedScratch {
 public:
  ZeroedScratch() = default;
  ZeroedScratch(const ZeroedScratch&) = delete;
  ZeroedScratch& operator=(const ZeroedScratch&) = delete;
  ~ZeroedScratch() { Release(); }
  void Allocate(size_t size) {
    Release();
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    data_ = static_cast<unsigned char*>(p);
    size_ = size;
  }
  unsigned char* data() const { return data_; }
  unsigned char& operator[](size_t i) const { return data_[i]; }

 private:
  void Release() {
    if (data_ != nullptr) ::munmap(data_, size_);
    data_ = nullptr;
    size_ = 0;
  }
  unsigned char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace hvtrace

#endif  // HVTRACE_SHARED_DECODE_SRC_ZEROED_SCRATCH_H_
