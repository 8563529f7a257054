// Host emulation of the CUDA subset of force.cu.j2: one OS thread per CUDA thread,
// __syncthreads = a block barrier, __syncwarp = a barrier of the thread's warp.
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>
using std::fma; using std::max; using std::min;
struct dim3_ { unsigned x; };
thread_local dim3_ threadIdx, blockIdx;
dim3_ gridDim, blockDim;
std::barrier<>* g_bar;
std::vector<std::unique_ptr<std::barrier<>>> g_warp;
inline void __syncthreads() { g_bar->arrive_and_wait(); }
inline void __syncwarp() { g_warp[threadIdx.x / 32]->arrive_and_wait(); }
inline void __threadfence_system() {}
template <class T> inline T __ldg(const T* p) { return *p; }
template <class T> inline T atomicAdd(T* p, T v) { return std::atomic_ref<T>(*p).fetch_add(v); }
#define __global__
#define __constant__
#define __launch_bounds__(...)
#define __shared__
#define __align__(n)
#define __restrict__ __restrict
alignas(16) unsigned char stc_smem_raw[1 << 22];
