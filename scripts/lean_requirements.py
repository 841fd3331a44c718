"""Splits pip's resolution of requirements.txt into what to install and what
this machine already has (used by scripts/deps.sh).

The torch wheel on PyPI is a CUDA build: it asks for about 3.5 GB of CUDA
libraries as wheels (cuBLAS, cuDNN, cuFFT, ...) and 1 GB of Triton. Where the
machine's own CUDA toolkit already provides a library under the soname the
wheel links (ldconfig knows it), its wheel is left out; Triton is left out
where there is no GPU (it only compiles GPU kernels). deps.sh then checks that
`import torch` works and installs the left-out wheels if it does not.

Usage: lean_requirements.py REPORT.json KEEP_FILE SKIP_FILE
  REPORT.json  `pip install --dry-run --ignore-installed --report` output
  KEEP_FILE    written: name==version lines to install (with --no-deps)
  SKIP_FILE    written: name==version lines left out
"""
import json
import os
import subprocess
import sys

# PyPI package -> the sonames that libtorch*.so needs from it.
SYSTEM_LIBRARIES = {
    "nvidia-cublas": ["libcublas.so.13", "libcublasLt.so.13"],
    "nvidia-cuda-runtime": ["libcudart.so.13"],
    "nvidia-cuda-nvrtc": ["libnvrtc.so.13"],
    "nvidia-cuda-cupti": ["libcupti.so.13"],
    "nvidia-cufft": ["libcufft.so.12"],
    "nvidia-cusolver": ["libcusolver.so.12"],
    "nvidia-cusparse": ["libcusparse.so.12"],
    "nvidia-nvjitlink": ["libnvJitLink.so.13"],
    "nvidia-curand": ["libcurand.so.10"],
    "nvidia-cudnn-cu13": ["libcudnn.so.9"],
}


def known_sonames():
    out = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines()[1:] if line.strip()}


def has_gpu():
    return os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl")


def main(report_path, keep_path, skip_path):
    with open(report_path) as f:
        report = json.load(f)
    sonames = known_sonames()
    keep, skip = [], []
    for item in report["install"]:
        name = item["metadata"]["name"].lower().replace("_", "-")
        pin = f"{name}=={item['metadata']['version']}"
        provided = name in SYSTEM_LIBRARIES and all(s in sonames for s in SYSTEM_LIBRARIES[name])
        (skip if provided or (name == "triton" and not has_gpu()) else keep).append(pin)
    for path, pins in ((keep_path, keep), (skip_path, skip)):
        with open(path, "w") as f:
            f.write("".join(p + "\n" for p in pins))
    print(f"deps: {len(keep)} Python packages to install; left out (the machine has them, or no GPU): "
          + (" ".join(skip) or "none"))


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
