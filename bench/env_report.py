"""Print the facts that measurements depend on: GPU, driver, CUDA, cuDNN (and where it was loaded from)."""
from __future__ import annotations

import json
import platform
import sys


def report() -> dict:
    facts = {"python": sys.version.split()[0], "platform": platform.platform()}
    try:
        import torch  # loaded first so that ucudnn shares torch's libcudnn

        facts.update(torch=torch.__version__, torch_cudnn=torch.backends.cudnn.version())
    except ImportError:
        facts["torch"] = None
    import cupy

    from ucudnn.execute import gpu
    from ucudnn.execute.bindings import cudnn

    info = gpu.device_info()
    facts.update(cupy=cupy.__version__, cuda_runtime=cupy.cuda.runtime.runtimeGetVersion(),
                 gpu=info.gpu_name, compute_capability=info.compute_capability,
                 driver=info.driver_version, cudnn=info.cudnn_version, cudnn_library=cudnn.library_path)
    return facts


if __name__ == "__main__":
    print(json.dumps(report(), indent=1))
