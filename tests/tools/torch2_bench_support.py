"""What the tests of the PyTorch 2 benchmark scripts (tools/bench-cpu-step,
tools/bench-offload-adamw) share: they run under the tools/py-env python and skip (exit 77,
ctest's SKIP_RETURN_CODE) without PyTorch 2 or without the binary they drive."""
import os
import sys


def skip(why: str) -> None:
    print("skipped: " + why)
    sys.exit(77)


def require(build: str, binary: str, why_torch2: str) -> None:
    """Skips unless PyTorch >= 2 imports and BUILD/bin/BINARY is built."""
    try:
        import torch
        if int(torch.__version__.split(".")[0]) < 2:
            skip(f"PyTorch {torch.__version__} ({why_torch2}: tools/py-env)")
    except ImportError:
        skip("no PyTorch (tools/py-env)")
    if not os.access(os.path.join(build, "bin", binary), os.X_OK):
        skip(f"{binary} is not built")
