// Small kernels outside the forward's op set.

// Keeps the stream busy for about `cycles` clock cycles (one thread), so that the host can queue a whole
// forward before the GPU starts it: the profiler's events then time the GPU's work, not the host's launches.
extern "C" __global__ void spin_wait(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}
