"""image_transform: reference vs torchvision's outputs (tests/fixtures/cameras, made by
torchvision itself), fused kernel vs reference, sampler semantics, validation."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from robocache.errors import DTypeError, ShapeError
from robocache.ops.image import (
    COLOR_OPS,
    ImageTransformParams,
    ImageTransformsConfig,
    image_transform,
    sample_image_transforms,
)
from robocache.reference import image as ref

TV = dict(np.load(Path(__file__).parent.parent / "fixtures" / "cameras" / "torchvision_ops.npz"))
IMG = torch.from_numpy(TV["image"])  # float [4, 3, 13, 17] on uint8 levels
U8 = (IMG * 255).round().to(torch.uint8)
N, H, W = IMG.shape[0], IMG.shape[2], IMG.shape[3]
FULL = torch.tensor([[0.0, 0.0, H, W]]).repeat(N, 1)
IDENT = torch.tensor([[1.0, 0, 0, 0, 1, 0]]).repeat(N, 1)
# the kernel vs float32 PyTorch: FMA contraction and approximate division move sample
# coordinates and hue by ~1e-6, values by up to ~1e-5 (a grey level is 3.9e-3)
KERNEL_ATOL = 5e-5


def tv_affine(angle_deg: float, tx: float, ty: float) -> list[float]:
    r = math.radians(angle_deg)
    c, s = math.cos(r), math.sin(r)
    return [c, s, -c * tx - s * ty, -s, c, s * tx - c * ty]


def run(device: str, frames, crop, affine, ops, factors, size, dtype=torch.float32):
    """The fused kernel on `device` (CUDA, or the Triton interpreter on CPU tensors)."""
    from robocache.kernels.image import image_transform_cuda, slot_ops

    out = torch.full((frames.shape[0], 3, *size), float("nan")).to(dtype).to(device)
    image_transform_cuda(*(t.to(device) for t in (frames, crop, affine, ops, factors)), out,
                         slots=slot_ops(ops))
    return out


@pytest.mark.parametrize("op", COLOR_OPS)
def test_colour_ops_match_torchvision(op):
    """The reference, op by op (the kernel runs all five in the chain test below)."""
    ops = torch.full((N, 1), COLOR_OPS.index(op), dtype=torch.int32)
    f = torch.from_numpy(TV[f"{op}_factor"])[:, None]
    torch.testing.assert_close(ref.color(IMG, ops, f), torch.from_numpy(TV[op]), rtol=0,
                               atol=2e-6)


def test_chain_and_geometry_match_torchvision(kernel_device):
    names = ["hue", "sharpness", "contrast", "brightness", "saturation"]
    ops = torch.tensor([[COLOR_OPS.index(n) for n in names]] * N, dtype=torch.int32)
    f = torch.stack([torch.from_numpy(TV[f"{n}_factor"]) for n in names], 1)
    want = torch.from_numpy(TV["chain"])
    torch.testing.assert_close(run(kernel_device, U8, FULL, IDENT, ops, f, (H, W)).cpu(), want,
                               rtol=0, atol=KERNEL_ATOL)
    none = torch.full((N, 1), -1, dtype=torch.int32)
    crop = torch.from_numpy(TV["crop_box"]).float()
    torch.testing.assert_close(ref.warp(U8, crop, IDENT, (9, 11)),
                               torch.from_numpy(TV["resized_crop"]), rtol=0, atol=2e-6)
    got = run(kernel_device, U8, crop, IDENT, none, none.float(), (9, 11)).cpu()
    torch.testing.assert_close(got, torch.from_numpy(TV["resized_crop"]), rtol=0, atol=KERNEL_ATOL)
    aff = torch.tensor([tv_affine(a, *t) for a, t in
                        zip(TV["affine_angle"], TV["affine_translate"], strict=True)])
    want = torch.from_numpy(TV["affine"])
    torch.testing.assert_close(ref.warp(U8, FULL, aff, (H, W)), want, rtol=0, atol=2e-6)
    got = run(kernel_device, U8, FULL, aff, none, none.float(), (H, W)).cpu()
    torch.testing.assert_close(got, want, rtol=0, atol=KERNEL_ATOL)


@pytest.mark.parametrize("n, hw, size, dtype", [(1, (5, 7), (3, 3), torch.float32),
                                                (5, (11, 13), (7, 9), torch.bfloat16),
                                                (3, (9, 11), (9, 11), torch.uint8)])
def test_kernel_matches_reference_on_random_draws(kernel_device, n, hw, size, dtype):
    frames = torch.randint(0, 256, (n, *hw, 3), dtype=torch.uint8).permute(0, 3, 1, 2)
    cfg = ImageTransformsConfig(max_num_transforms=6, random_order=True, crop_scale=(0.5, 1))
    p = sample_image_transforms(n, hw, cfg, seed=int(torch.randint(0, 1000, ())))
    want = ref.image_transform(frames, p.crop, p.affine, p.ops, p.factors, size)
    want = (want * 255).round() if dtype == torch.uint8 else want
    got = run(kernel_device, frames, p.crop, p.affine, p.ops, p.factors, size, dtype).cpu()
    assert not got.float().isnan().any()
    tol = {torch.float32: KERNEL_ATOL, torch.bfloat16: 7.8e-3, torch.uint8: 1.0}[dtype]
    torch.testing.assert_close(got.float(), want.to(dtype).float(), rtol=0, atol=tol)


def test_sampler_follows_lerobot_semantics():
    cfg = ImageTransformsConfig(max_num_transforms=2, weights={"hue": 1.0, "brightness": 3.0})
    p = sample_image_transforms(4000, (48, 64), cfg, seed=1)
    assert p.ops.shape == (4000, 2)
    assert (p.ops[:, 0] == COLOR_OPS.index("brightness")).all()  # listed order when not random
    assert (p.ops[:, 1] == COLOR_OPS.index("hue")).all()
    assert p.factors[:, 0].min() >= 0.8 and p.factors[:, 0].max() <= 1.2
    one = sample_image_transforms(4000, (48, 64), ImageTransformsConfig(
        max_num_transforms=1, weights={"hue": 1.0, "brightness": 3.0}), seed=1)
    share = float((one.ops[:, 0] == COLOR_OPS.index("brightness")).float().mean())
    assert abs(share - 0.75) < 0.03  # drawn in proportion to the weights
    again = sample_image_transforms(4000, (48, 64), cfg, seed=1)
    for a, b in zip((p.crop, p.affine, p.ops, p.factors),
                    (again.crop, again.affine, again.ops, again.factors), strict=True):
        assert torch.equal(a, b)
    aff = sample_image_transforms(50, (48, 64), ImageTransformsConfig(
        max_num_transforms=1, weights={"affine": 1.0}), seed=2)
    assert (aff.ops == -1).all() and (aff.affine[:, 1].abs() <= math.sin(math.radians(5))).all()
    assert (aff.affine[:, 2].abs() <= 0.05 * 64 + 0.05 * 48 + 1).all()


def test_public_op_cpu_and_validation():
    frames = torch.randint(0, 256, (2, 3, 8, 10), dtype=torch.uint8)
    torch.testing.assert_close(image_transform(frames, (8, 10)), frames.float() / 255, rtol=0,
                               atol=1e-6)
    out = torch.empty(2, 3, 4, 5, dtype=torch.uint8)
    assert image_transform(frames, (4, 5), dtype=torch.uint8, out=out) is out
    with pytest.raises(DTypeError, match="frames"):
        image_transform(frames.float(), (4, 4))
    with pytest.raises(ShapeError, match=r"permute\(0, 3, 1, 2\)"):
        image_transform(frames.permute(0, 2, 3, 1), (4, 4))
    with pytest.raises(ShapeError, match="rows for 2 frames"):
        image_transform(frames, (4, 4), ImageTransformParams.identity(3, (8, 10)))
    with pytest.raises(ValueError, match="weights"):
        sample_image_transforms(2, (8, 10), ImageTransformsConfig(weights={"blur": 1.0}))


@pytest.mark.gpu
def test_cuda_matches_torchvision_live():
    F = pytest.importorskip("torchvision.transforms.v2.functional",
                            reason="needs torchvision (pip install 'robocache[vision]')")

    frames = torch.randint(0, 256, (6, 3, 31, 37), dtype=torch.uint8)
    p = sample_image_transforms(6, (31, 37), ImageTransformsConfig(max_num_transforms=5),
                                seed=5)
    got = image_transform(frames.cuda(), (31, 37), p.to("cuda")).cpu()
    fns = [F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue,
           F.adjust_sharpness]
    for i in range(6):
        x = ref.warp(frames[i:i + 1], p.crop[i:i + 1], p.affine[i:i + 1], (31, 37))[0]
        for op, f in zip(p.ops[i].tolist(), p.factors[i].tolist(), strict=True):
            if op >= 0:
                x = fns[op](x, f)
        torch.testing.assert_close(got[i], x, rtol=0, atol=1e-4)
