// KVF_HOST_DEVICE marks a function callable from host C++ and, when compiled by
// nvcc, from CUDA device code. Header-only kernels math (lse.h,
// float_convert.h) uses it so that the CPU reference and the CUDA kernels run
// the same source.
#ifndef KVFABRIC_GPU_KERNELS_HOST_DEVICE_H_
#define KVFABRIC_GPU_KERNELS_HOST_DEVICE_H_

#if defined(__CUDACC__)
#define KVF_HOST_DEVICE __host__ __device__
#else
#define KVF_HOST_DEVICE
#endif

#endif  // KVFABRIC_GPU_KERNELS_HOST_DEVICE_H_
