// Copies out of a file mapping without dying of SIGBUS. A page of a mapped file that
// no longer exists (the file was truncated after it was mapped) raises SIGBUS when it
// is touched; CopyFromMapping turns that into a false return, so a reader can answer
// with a Status instead of a crash.
//
// How: one process-wide SIGBUS handler, installed at the first call and chained to
// whatever handler was there before. A copy in progress registers its thread, source
// range and jump buffer in a fixed table (no thread-locals: the handler reads only
// that table); the handler jumps back into the copy (siglongjmp) when the faulting
// thread is copying and the address lies in its source range. Every other SIGBUS goes
// to the previous handler, or kills the process as it would have without this one.
#ifndef MOERT_CORE_GUARDED_COPY_H_
#define MOERT_CORE_GUARDED_COPY_H_

#include <cstddef>

namespace moert::core {

// memcpy(dst, src, n), except that a SIGBUS reading src stops the copy and returns
// false (dst then holds some of the bytes). dst must be ordinary memory.
bool CopyFromMapping(void* dst, const void* src, size_t n);

}  // namespace moert::core

#endif  // MOERT_CORE_GUARDED_COPY_H_
