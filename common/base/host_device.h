// TANDEM_HOST_DEVICE marks functions that the CPU code and the CUDA kernels
// share (philox.h, fp8.h): __host__ __device__ under nvcc, nothing else.
#ifndef TANDEM_COMMON_BASE_HOST_DEVICE_H_
#define TANDEM_COMMON_BASE_HOST_DEVICE_H_

#if defined(__CUDACC__)
#define TANDEM_HOST_DEVICE __host__ __device__
#else
#define TANDEM_HOST_DEVICE
#endif

#endif  // TANDEM_COMMON_BASE_HOST_DEVICE_H_
