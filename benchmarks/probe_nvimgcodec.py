"""nvImageCodec's JPEG encoder on one GPU against torchvision's nvJPEG, in one process: the
same 64 frames (480x640, ramps and sharp-edged blocks, q95 4:4:4), which nvImageCodec encoder
configurations create and encode, and frames/s over 4 batches after a warm-up batch.

    pip install --target /tmp/nv nvidia-nvimgcodec-cu13 nvidia-nvjpeg
    PYTHONPATH=/tmp/nv python benchmarks/probe_nvimgcodec.py

Configurations that allow nvImageCodec's CPU backends may encode on CPU threads (OpenCV);
only ``GPU_ONLY`` and ``HYBRID_CPU_GPU`` keep the encode on the GPU.
"""

from __future__ import annotations

import time

import torch
from nvidia import nvimgcodec as nv
from torchvision.io import encode_jpeg

BATCHES = 4


def frames(n: int = 64) -> list[torch.Tensor]:
    y, x = torch.meshgrid(torch.arange(480, device="cuda"), torch.arange(640, device="cuda"),
                          indexing="ij")
    return [torch.stack([(x + i) % 256, (y * 2 + i) % 256, ((x // 40 + y // 40) % 2) * 200],
                        -1).to(torch.uint8).contiguous() for i in range(n)]


def rate(encode) -> float:
    encode()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(BATCHES):
        encode()
    torch.cuda.synchronize()
    return BATCHES / (time.perf_counter() - t)


def main() -> None:
    hwc = frames()
    chw = [f.permute(2, 0, 1).contiguous() for f in hwc]
    print(f"nvimgcodec {getattr(nv, '__version__', '?')}, {torch.cuda.get_device_name()}")
    print(f"torchvision: {len(hwc) * rate(lambda: encode_jpeg(chw, quality=95)):,.0f} frames/s")
    params = nv.EncodeParams(quality_type=nv.QualityType.QUALITY, quality_value=95.0,
                             chroma_subsampling=nv.ChromaSubsampling.CSS_444)
    stream = torch.cuda.current_stream().cuda_stream
    gpu, hybrid = ([nv.Backend(k)] for k in (nv.BackendKind.GPU_ONLY,
                                                nv.BackendKind.HYBRID_CPU_GPU))
    configs = {
        "default (CPU codecs allowed)": {},
        "threads8 (CPU codecs allowed)": dict(max_num_cpu_threads=8),
        "gpu_only": dict(backends=gpu),
        "gpu_only_t8_s8": dict(max_num_cpu_threads=8, backends=gpu,
                               options=":num_cuda_streams=8"),
        "hybrid": dict(backends=hybrid),
        "hybrid_t8": dict(max_num_cpu_threads=8, backends=hybrid),
        "hybrid_t8_s8": dict(max_num_cpu_threads=8, backends=hybrid,
                             options=":num_cuda_streams=8"),
        "hybrid_t15_s15": dict(max_num_cpu_threads=15, backends=hybrid,
                               options=":num_cuda_streams=15"),
    }
    for name, kw in configs.items():
        try:
            encoder = nv.Encoder(device_id=0, **kw)

            def encode(encoder=encoder):
                return encoder.encode(nv.as_images(hwc, stream), "jpeg", params=params,
                                      cuda_stream=stream)

            ok = sum(c is not None and bytes(c)[:2] == b"\xff\xd8" for c in encode())
            print(f"{name}: {ok}/{len(hwc)} JPEG, {len(hwc) * rate(encode):,.0f} frames/s")
        except RuntimeError as e:
            print(f"{name}: failed: {str(e)[:200]}")


if __name__ == "__main__":
    main()
