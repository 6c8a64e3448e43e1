// Device memory: an owning cl_mem (RAII, movable), blocking or queued host<->device
// copies, and map/unmap for zero-copy access where host and device share memory
// (buffers made with host_visible = true use CL_MEM_ALLOC_HOST_PTR, which unified-
// memory drivers back with memory both sides reach without a copy).
#ifndef MOERT_BACKEND_OPENCL_BUFFER_H_
#define MOERT_BACKEND_OPENCL_BUFFER_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "backend/opencl/cl_status.h"

namespace moert::backend::opencl {

class Device;

class Buffer {
 public:
  Buffer() = default;
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  // `bytes` > 0. ResourceExhausted when the device cannot hold it (or it is above
  // CL_DEVICE_MAX_MEM_ALLOC_SIZE).
  static absl::StatusOr<Buffer> Create(Device& device, size_t bytes, bool host_visible = false);
  // A buffer over host memory the caller keeps valid and writes (CL_MEM_USE_HOST_PTR):
  // on a unified-memory device the kernels read it in place, without a copy; elsewhere
  // the driver keeps a device copy. After the host writes a range, Publish it before a
  // kernel reads it.
  static absl::StatusOr<Buffer> WrapHost(Device& device, void* host, size_t bytes);
  // A buffer holding a copy of `bytes` bytes at `data`.
  static absl::StatusOr<Buffer> FromHost(Device& device, const void* data, size_t bytes,
                                         bool host_visible = false);

  // Copies into / out of the buffer at `offset`. blocking = false only enqueues
  // (the host memory must then stay valid until Device::Finish).
  absl::Status Write(Device& device, const void* data, size_t bytes, size_t offset = 0,
                     bool blocking = true);
  absl::Status Read(Device& device, void* data, size_t bytes, size_t offset = 0) const;

  // Maps the whole buffer for host access (blocking; write = the host will write,
  // so the device's content need not be copied out). Unmap before the next kernel.
  absl::StatusOr<void*> Map(Device& device, bool write);
  absl::Status Unmap(Device& device, void* mapped);

  // WrapHost buffers: makes the host's writes to [offset, offset + bytes) visible to
  // the device (a map for writing of the range, then its unmap: no copy where the
  // device reads host memory in place, the range's upload where it does not).
  absl::Status Publish(Device& device, size_t offset, size_t bytes);

  bool empty() const { return mem_ == nullptr; }
  cl_mem get() const { return mem_; }
  size_t size() const { return size_; }

 private:
  cl_mem mem_ = nullptr;
  size_t size_ = 0;
  uint8_t* host_ = nullptr;  // WrapHost's memory
};

// A place in a buffer for a kernel argument: the buffer and a byte offset (kept a
// multiple of the element size). Lets ops address one expert of a stacked weight
// buffer or one layer's slice of a KV cache without sub-buffers, whose offsets
// drivers restrict to CL_DEVICE_MEM_BASE_ADDR_ALIGN.
struct BufferRef {
  cl_mem mem = nullptr;
  size_t offset = 0;

  BufferRef() = default;
  BufferRef(const Buffer& b, size_t byte_offset = 0)  // NOLINT: a buffer is a ref at 0
      : mem(b.get()), offset(byte_offset) {}
  bool empty() const { return mem == nullptr; }
};

}  // namespace moert::backend::opencl

#endif  // MOERT_BACKEND_OPENCL_BUFFER_H_
