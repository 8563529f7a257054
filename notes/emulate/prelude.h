// Host emulation of the CUDA subset smalltc's action kernels use: one OS thread per CUDA
// thread, __syncthreads() = std::barrier; blocks run one after the other.
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>
using std::fma;
struct dim3_ { unsigned x; };
thread_local dim3_ threadIdx, blockIdx;
dim3_ gridDim, blockDim;
std::barrier<>* g_bar;
inline void __syncthreads() { g_bar->arrive_and_wait(); }
template <class T> inline T __ldg(const T* p) { return *p; }
#define __global__
#define __launch_bounds__(...)
#define __shared__
#define __constant__
#define __device__
#define __forceinline__ inline
#define __align__(n)
#define __restrict__ __restrict
alignas(16) unsigned char stc_smem_raw[1 << 22];
