"""Builds the `ulorl` package with torch.utils.cpp_extension (offline: it needs only the installed
torch, pybind11 and setuptools), from the same sources CMake builds (python/src) and the headers in
../include:

    pip install --no-build-isolation ./python

--no-build-isolation makes pip use the torch already installed (Debian's python3-torch), which
the extension must match; pip's isolated build would try to download one.
"""

import os
import platform

import torch
from setuptools import setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

HERE = os.path.dirname(os.path.abspath(__file__))
INCLUDE = os.path.normpath(os.path.join(HERE, "..", "include"))
if not os.path.isfile(os.path.join(INCLUDE, "ulorl", "ulorl.hpp")):
    raise SystemExit(f"ulorl's headers are not at {INCLUDE}: build from the ulorl source tree (pip install ./python)")

# Run-time ISA dispatch (x86-64): the policy-loss and logits kernels again for AVX2 + FMA and for
# AVX-512 F/BW/DQ/VL + FMA, each in a static library (build_clib) that build_ext links after the
# extension's objects, installed at import where the CPU has the set (the widest).
X86 = platform.machine().lower() in ("x86_64", "amd64")
ISA_FLAGS = {"avx2": ["-mavx2", "-mfma"],
             "avx512": ["-mavx2", "-mfma", "-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl"]}
LIBRARIES = [(f"ulorl_kernels_{isa}", {"sources": [os.path.join("src", f"kernels_{isa}.cpp")], "include_dirs": [INCLUDE],
                                       "cflags": ["-std=c++20", "-O2", "-g0", "-fPIC"] + flags})
             for isa, flags in ISA_FLAGS.items()] if X86 else []

KERNELS = os.path.normpath(os.path.join(HERE, "..", "kernels"))
SOURCES = [os.path.join("src", f) for f in ("module.cpp", "losses.cpp", "logits.cpp", "corrections.cpp")]
# With a torch built with CUDA and nvcc (CUDA_HOME), the operators get their CUDA kernels
# (ULORL_PYTHON_CUDA=0 builds without them): ops_cuda.cu (nvcc, C++17) and ops_cuda.cpp (host, C++20).
CUDA = torch.version.cuda is not None and CUDA_HOME is not None and os.environ.get("ULORL_PYTHON_CUDA", "1") != "0"
if CUDA:
    EXTENSION = CUDAExtension(
        name="ulorl._ulorl",
        sources=SOURCES + [os.path.join("src", "ops_cuda.cpp"), os.path.join("src", "ops_cuda.cu")],
        include_dirs=[INCLUDE, KERNELS],
        extra_compile_args={"cxx": ["-std=c++20", "-O2", "-g0"],
                            "nvcc": ["-std=c++17", "-O3", "--expt-relaxed-constexpr"]},
        define_macros=[("ULORL_PY_CUDA", None)] + ([("ULORL_PY_ISA_KERNELS", None)] if X86 else []),
        libraries=["cublas"],  # the linear head's GEMMs (src/ops_cuda.cu)
    )
else:
    EXTENSION = CppExtension(
        name="ulorl._ulorl",
        sources=SOURCES,
        include_dirs=[INCLUDE],
        extra_compile_args=["-std=c++20", "-O2", "-g0"],
        define_macros=[("ULORL_PY_ISA_KERNELS", None)] if X86 else [],
    )

setup(
    name="ulorl",
    version="0.1.0",
    description="RLVR algorithms for reasoning LLMs (GRPO-family advantages, policy losses with exact gradients, "
                "KL estimators, controllers, UloRL's segment scheduler, fused logits kernels) over torch tensors",
    packages=["ulorl", "ulorl.presets"],
    package_data={"ulorl": ["py.typed", "*.pyi"]},
    ext_modules=[EXTENSION],
    libraries=LIBRARIES,
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=False)},
    python_requires=">=3.9",
    install_requires=["torch", "numpy"],
    zip_safe=False,
)
