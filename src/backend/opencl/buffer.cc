// Device buffers (see buffer.h).
#include "backend/opencl/buffer.h"

#include <cstring>
#include <utility>

#include "backend/opencl/device.h"
#include "core/status.h"
#include "core/strings.h"

namespace moert::backend::opencl {

Buffer::~Buffer() {
  if (mem_ != nullptr) clReleaseMemObject(mem_);
}

Buffer::Buffer(Buffer&& other) noexcept
    : mem_(std::exchange(other.mem_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      host_(std::exchange(other.host_, nullptr)) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    if (mem_ != nullptr) clReleaseMemObject(mem_);
    mem_ = std::exchange(other.mem_, nullptr);
    size_ = std::exchange(other.size_, 0);
    host_ = std::exchange(other.host_, nullptr);
  }
  return *this;
}

absl::StatusOr<Buffer> Buffer::Create(Device& device, size_t bytes, bool host_visible) {
  if (bytes == 0) return absl::InvalidArgumentError("OpenCL: a buffer of 0 bytes");
  if (bytes > device.info().max_alloc_bytes) {
    return absl::ResourceExhaustedError(StrCat("OpenCL: a buffer of ", bytes,
                                               " bytes is above the device's largest allocation (",
                                               device.info().max_alloc_bytes, " bytes)"));
  }
  cl_int err = CL_SUCCESS;
  const cl_mem_flags flags = CL_MEM_READ_WRITE | (host_visible ? CL_MEM_ALLOC_HOST_PTR : 0);
  cl_mem mem = clCreateBuffer(device.context(), flags, bytes, nullptr, &err);
  MOERT_CL_RETURN_IF_ERROR(err, StrCat("clCreateBuffer(", bytes, " bytes)"));
  Buffer b;
  b.mem_ = mem;
  b.size_ = bytes;
  return b;
}

absl::StatusOr<Buffer> Buffer::WrapHost(Device& device, void* host, size_t bytes) {
  if (bytes == 0 || host == nullptr) {
    return absl::InvalidArgumentError("OpenCL: wrapping no host memory");
  }
  if (bytes > device.info().max_alloc_bytes) {
    return absl::ResourceExhaustedError(StrCat("OpenCL: host memory of ", bytes,
                                               " bytes is above the device's largest allocation (",
                                               device.info().max_alloc_bytes, " bytes)"));
  }
  cl_int err = CL_SUCCESS;
  cl_mem mem =
      clCreateBuffer(device.context(), CL_MEM_READ_ONLY | CL_MEM_USE_HOST_PTR, bytes, host, &err);
  MOERT_CL_RETURN_IF_ERROR(err, StrCat("clCreateBuffer(CL_MEM_USE_HOST_PTR, ", bytes, " bytes)"));
  Buffer b;
  b.mem_ = mem;
  b.size_ = bytes;
  b.host_ = static_cast<uint8_t*>(host);
  return b;
}

absl::Status Buffer::Publish(Device& device, size_t offset, size_t bytes) {
  if (host_ == nullptr) return absl::FailedPreconditionError("OpenCL: Publish of a device buffer");
  if (offset > size_ || bytes > size_ - offset) {
    return absl::OutOfRangeError(
        StrCat("OpenCL: publish of ", bytes, " bytes at ", offset, " of a buffer of ", size_));
  }
  if (bytes == 0) return absl::OkStatus();
  // Invalidate-region: the driver need not copy its view out first (that would
  // overwrite the host's new bytes with the device's old ones). For a USE_HOST_PTR
  // buffer the mapped pointer is host + offset, which already holds the bytes; a
  // driver that maps elsewhere gets them copied in.
  cl_int err = CL_SUCCESS;
  void* p = clEnqueueMapBuffer(device.queue(), mem_, CL_TRUE, CL_MAP_WRITE_INVALIDATE_REGION,
                               offset, bytes, 0, nullptr, nullptr, &err);
  MOERT_CL_RETURN_IF_ERROR(err, "clEnqueueMapBuffer(publish)");
  if (p != host_ + offset) std::memcpy(p, host_ + offset, bytes);
  return Unmap(device, p);
}

absl::StatusOr<Buffer> Buffer::FromHost(Device& device, const void* data, size_t bytes,
                                        bool host_visible) {
  MOERT_ASSIGN_OR_RETURN(Buffer b, Create(device, bytes, host_visible));
  MOERT_RETURN_IF_ERROR(b.Write(device, data, bytes));
  return b;
}

absl::Status Buffer::Write(Device& device, const void* data, size_t bytes, size_t offset,
                           bool blocking) {
  if (offset > size_ || bytes > size_ - offset) {
    return absl::OutOfRangeError(
        StrCat("OpenCL: write of ", bytes, " bytes at ", offset, " into a buffer of ", size_));
  }
  if (bytes == 0) return absl::OkStatus();
  return ClStatus(clEnqueueWriteBuffer(device.queue(), mem_, blocking ? CL_TRUE : CL_FALSE, offset,
                                       bytes, data, 0, nullptr, nullptr),
                  "clEnqueueWriteBuffer");
}

absl::Status Buffer::Read(Device& device, void* data, size_t bytes, size_t offset) const {
  if (offset > size_ || bytes > size_ - offset) {
    return absl::OutOfRangeError(
        StrCat("OpenCL: read of ", bytes, " bytes at ", offset, " from a buffer of ", size_));
  }
  if (bytes == 0) return absl::OkStatus();
  return ClStatus(
      clEnqueueReadBuffer(device.queue(), mem_, CL_TRUE, offset, bytes, data, 0, nullptr, nullptr),
      "clEnqueueReadBuffer");
}

absl::StatusOr<void*> Buffer::Map(Device& device, bool write) {
  cl_int err = CL_SUCCESS;
  void* p = clEnqueueMapBuffer(device.queue(), mem_, CL_TRUE,
                               write ? (CL_MAP_READ | CL_MAP_WRITE) : CL_MAP_READ, 0, size_, 0,
                               nullptr, nullptr, &err);
  MOERT_CL_RETURN_IF_ERROR(err, "clEnqueueMapBuffer");
  return p;
}

absl::Status Buffer::Unmap(Device& device, void* mapped) {
  return ClStatus(clEnqueueUnmapMemObject(device.queue(), mem_, mapped, 0, nullptr, nullptr),
                  "clEnqueueUnmapMemObject");
}

}  // namespace moert::backend::opencl
