// Every CUDA kernel of the backend, in one translation unit so that nvcc makes one fatbin.
// Entry points are extern "C" so the host finds them by name (cuModuleGetFunction); the names
// and parameter lists are the contract with cuda_ops.c. Baseline is sm_75: dp4a, shuffles.
#include <cuda_fp16.h>
#include <stdint.h>

#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/sync.cuh"
#include "kernels/cuda/mmvq.cuh"
#include "kernels/cuda/ops.cuh"
#include "kernels/cuda/moe.cuh"
#include "kernels/cuda/mmq.cuh"
