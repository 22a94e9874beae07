// Host helpers of the stand-alone kernel labs (gemv-lab.cu, gemm-lab.cu): a CUDA call checked, and the 16-bit
// float forms their random inputs take.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cstring>

#define CK(e)                                                                                   \
    do {                                                                                        \
        cudaError_t err_ = (e);                                                                 \
        if (err_ != cudaSuccess) {                                                              \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #e, cudaGetErrorString(err_)); \
            exit(1);                                                                            \
        }                                                                                       \
    } while (0)

// An f16's value (normals and zero: the labs' scales).
static float h2f_host(unsigned short h) {
    unsigned e = (h >> 10) & 31, m = h & 1023, u = ((unsigned)(h & 0x8000) << 16) | (e ? ((e + 112) << 23) | (m << 13) : 0);
    float f;
    memcpy(&f, &u, 4);
    return f;
}
// A bf16's value, and the bf16 of an f32 by truncation (the labs' activation planes).
static float bf_host(unsigned short h) {
    unsigned u = (unsigned)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static unsigned short bf_trunc(float v) {
    unsigned u;
    memcpy(&u, &v, 4);
    return (unsigned short)(u >> 16);
}
