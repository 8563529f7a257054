// Host emulation of the CUDA subset smalltc's kernels use (tests/test_cuda_basis.py): one OS
// thread per CUDA thread, __syncthreads() a std::barrier, the blocks one after the other, the
// shared memory one host buffer filled with garbage (0xff bytes: NaN) before each launch.
// It checks a rendered kernel's index arithmetic, barriers and arguments, not the GPU.
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
using std::fma;
using std::max;
using std::min;
struct stc_dim3 { unsigned x; };
thread_local stc_dim3 threadIdx, blockIdx;
stc_dim3 gridDim, blockDim;
std::barrier<>* stc_bar;
inline void __syncthreads() { stc_bar->arrive_and_wait(); }
inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }
template <class T> inline T __ldg(const T* p) { return *p; }
template <class T> inline T atomicAdd(T* p, T v) { return std::atomic_ref<T>(*p).fetch_add(v); }
#define __global__
#define __constant__
#define __launch_bounds__(...)
#define __restrict__ __restrict
alignas(16) unsigned char stc_smem_host[1 << 22];
// the kernels' `extern __shared__ ... stc_smem_raw[]` is replaced by this pointer
#define STC_HOST_SMEM unsigned char* const stc_smem_raw = stc_smem_host

template <class F> void stc_launch(int grid, int threads, F kernel) {
    std::memset(stc_smem_host, 0xff, sizeof stc_smem_host);
    gridDim.x = grid;
    blockDim.x = threads;
    for (int b = 0; b < grid; ++b) {
        std::barrier<> bar(threads);
        stc_bar = &bar;
        std::vector<std::thread> ts;
        for (int t = 0; t < threads; ++t)
            ts.emplace_back([=] { threadIdx.x = t; blockIdx.x = b; kernel(); });
        for (auto& th : ts) th.join();
    }
}

template <class T> std::vector<T> stc_read(const char* dir, const char* name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE* f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "cannot read %s\n", path); exit(2); }
    fseek(f, 0, SEEK_END);
    size_t n = ftell(f) / sizeof(T);
    fseek(f, 0, SEEK_SET);
    std::vector<T> v(n);
    if (fread(v.data(), sizeof(T), n, f) != n) { fprintf(stderr, "short %s\n", path); exit(2); }
    fclose(f);
    return v;
}

template <class T> void stc_write(const char* dir, const char* name, const std::vector<T>& v) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE* f = fopen(path, "wb");
    fwrite(v.data(), sizeof(T), v.size(), f);
    fclose(f);
}
