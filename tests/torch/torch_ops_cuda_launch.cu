// The device side of the torch operators' CUDA kernel for the tests: the one .cu file of the
// program that defines ulorl/kernels/torch_launch.hpp's launchers.
#include "ulorl/kernels/torch_launch.cuh"
