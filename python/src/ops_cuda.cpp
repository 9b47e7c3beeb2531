// python/src/ops_cuda.cpp — the operators' CUDA kernels for the `ulorl._ulorl` extension, in builds
// against a torch with CUDA (ULORL_PY_CUDA; the device side is ops_cuda.cu).
#include <ulorl/adapters/torch/ops_cuda.hpp>

namespace ulorl_py {

void register_cuda_kernels() { ulorl::th::ops::register_cuda_ops(); }

}  // namespace ulorl_py
