// Gated DeltaNet on tensor cores (mma.sync): see the functions below.
