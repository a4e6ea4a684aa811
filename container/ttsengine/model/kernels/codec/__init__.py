"""The codec's Triton kernels: Snake (and its time-major forms) and the time-major convolution."""
