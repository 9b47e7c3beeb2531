// python/src/ops_cuda.cu — the device side of the operators' CUDA kernels (the launchers of
// ulorl/kernels/torch_launch.hpp), in builds against a torch with CUDA.
#include <ulorl/kernels/torch_launch.cuh>
