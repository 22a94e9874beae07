// Fused element-wise kernels of the forward (norms, gates, split planes): see below.
