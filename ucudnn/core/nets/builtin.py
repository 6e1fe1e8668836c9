"""The networks of the paper's evaluation, as conv-layer tables built from their topologies.

AlexNet is Caffe's (227x227) in its single-column form: every layer has groups=1, where Caffe's
two-GPU model splits conv2, conv4 and conv5 into 2 groups. ResNets follow torchvision (stride in
the 3x3 conv, 1x1 downsample convs), DenseNet-40 TensorFlow's benchmark model (16-channel stem,
transitions keep the channel count), GoogLeNet Caffe's bvlc_googlenet (5x5 branches).

Each network's default batch (C3D, the 3-D U-Net and wav2vec's 1-D encoder too) is one the
shipped recording covers (bench/record.py's DEFAULT_SPECS), so `ucudnn optimize --net NAME` plans
without a GPU; tests/test_cli.py checks it.
"""
from __future__ import annotations

from .layers import ConvLayer, Network


def alexnet() -> Network:
    return Network("alexnet", (
        ConvLayer("conv1", 3, 96, 11, 227, stride=4),
        ConvLayer("conv2", 96, 256, 5, 27, pad=2),
        ConvLayer("conv3", 256, 384, 3, 13, pad=1),
        ConvLayer("conv4", 384, 384, 3, 13, pad=1),
        ConvLayer("conv5", 384, 256, 3, 13, pad=1),
    ), "Caffe AlexNet, single column (groups=1), 227x227", default_batch=256)


def _downsample(prefix: str, channels: int, out: int, size: int, stride: int) -> list[ConvLayer]:
    if stride == 1 and channels == out:
        return []
    return [ConvLayer(f"{prefix}.downsample.0", channels, out, 1, size, stride=stride)]


def _basic_block(prefix: str, channels: int, width: int, size: int, stride: int):
    conv1 = ConvLayer(f"{prefix}.conv1", channels, width, 3, size, stride=stride, pad=1)
    conv2 = ConvLayer(f"{prefix}.conv2", width, width, 3, conv1.output_size, pad=1)
    return [conv1, conv2, *_downsample(prefix, channels, width, size, stride)], width


def _bottleneck(prefix: str, channels: int, width: int, size: int, stride: int):
    out = 4 * width
    conv1 = ConvLayer(f"{prefix}.conv1", channels, width, 1, size)
    conv2 = ConvLayer(f"{prefix}.conv2", width, width, 3, size, stride=stride, pad=1)
    conv3 = ConvLayer(f"{prefix}.conv3", width, out, 1, conv2.output_size)
    return [conv1, conv2, conv3, *_downsample(prefix, channels, out, size, stride)], out


def _resnet(name: str, block, blocks_per_stage: tuple[int, ...], default_batch: int) -> Network:
    layers = [ConvLayer("conv1", 3, 64, 7, 224, stride=2, pad=3)]
    channels, size = 64, 56  # after the stride-2 3x3 max pool
    for stage, blocks in enumerate(blocks_per_stage):
        for index in range(blocks):
            stride = 2 if stage > 0 and index == 0 else 1
            added, channels = block(f"layer{stage + 1}.{index}", channels, 64 << stage, size, stride)
            layers += added
            size = added[-1].output_size
    return Network(name, tuple(layers), f"torchvision {name}, 224x224", default_batch)


def resnet18() -> Network:
    return _resnet("resnet18", _basic_block, (2, 2, 2, 2), default_batch=128)


def resnet50() -> Network:
    return _resnet("resnet50", _bottleneck, (3, 4, 6, 3), default_batch=64)


def densenet40(growth: int = 40, layers_per_block: int = 12) -> Network:
    layers = [ConvLayer("conv0", 3, 16, 3, 32, pad=1)]
    channels, size = 16, 32
    for block in (1, 2, 3):
        for index in range(1, layers_per_block + 1):
            layers.append(ConvLayer(f"block{block}.layer{index}", channels, growth, 3, size, pad=1))
            channels += growth
        if block < 3:  # a 1x1 conv, then a 2x2 average pool
            layers.append(ConvLayer(f"transition{block}", channels, channels, 1, size))
            size //= 2
    return Network("densenet40", tuple(layers), f"DenseNet-40 (k={growth}), CIFAR 32x32",
                   default_batch=256)


# Inception modules: 1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool projection output channels.
_INCEPTION = {
    "3a": (64, 96, 128, 16, 32, 32), "3b": (128, 128, 192, 32, 96, 64),
    "4a": (192, 96, 208, 16, 48, 64), "4b": (160, 112, 224, 24, 64, 64),
    "4c": (128, 128, 256, 24, 64, 64), "4d": (112, 144, 288, 32, 64, 64),
    "4e": (256, 160, 320, 32, 128, 128),
    "5a": (256, 160, 320, 32, 128, 128), "5b": (384, 192, 384, 48, 128, 128),
}
_STAGE_SIZE = {"3": 28, "4": 14, "5": 7}  # each stage starts after a stride-2 max pool


def _inception(name: str, channels: int, widths: tuple[int, ...]) -> tuple[list[ConvLayer], int]:
    one, reduce3, three, reduce5, five, proj = widths
    size, prefix = _STAGE_SIZE[name[0]], f"inception_{name}/"
    return [
        ConvLayer(prefix + "1x1", channels, one, 1, size),
        ConvLayer(prefix + "3x3_reduce", channels, reduce3, 1, size),
        ConvLayer(prefix + "3x3", reduce3, three, 3, size, pad=1),
        ConvLayer(prefix + "5x5_reduce", channels, reduce5, 1, size),
        ConvLayer(prefix + "5x5", reduce5, five, 5, size, pad=2),
        ConvLayer(prefix + "pool_proj", channels, proj, 1, size),
    ], one + three + five + proj


def googlenet() -> Network:
    layers = [
        ConvLayer("conv1/7x7_s2", 3, 64, 7, 224, stride=2, pad=3),
        ConvLayer("conv2/3x3_reduce", 64, 64, 1, 56),
        ConvLayer("conv2/3x3", 64, 192, 3, 56, pad=1),
    ]
    channels = 192
    for name, widths in _INCEPTION.items():
        added, channels = _inception(name, channels, widths)
        layers += added
    return Network("googlenet", tuple(layers), "GoogLeNet (Inception v1, Caffe bvlc_googlenet), 224x224",
                   default_batch=128)


def c3d() -> Network:
    """C3D's eight 3x3x3 convolutions on 16 frames of 112x112 (Tran et al., 2015): pool1 halves
    height and width only, pools 2-4 all three."""
    layers, channels = [], 3
    for name, out, size in (("conv1a", 64, (16, 112, 112)), ("conv2a", 128, (16, 56, 56)),
                            ("conv3a", 256, (8, 28, 28)), ("conv3b", 256, (8, 28, 28)),
                            ("conv4a", 512, (4, 14, 14)), ("conv4b", 512, (4, 14, 14)),
                            ("conv5a", 512, (2, 7, 7)), ("conv5b", 512, (2, 7, 7))):
        layers.append(ConvLayer(name, channels, out, 3, list(size), pad=1))
        channels = out
    return Network("c3d", tuple(layers), "C3D video network, 16 frames of 112x112 (3-D)", default_batch=16)


def unet3d(size: int = 64, classes: int = 3) -> Network:
    """A 3-D U-Net (Cicek et al., 2016) on one channel of size^3: two 3x3x3 convolutions per
    level, four levels; each decoder level up-samples by a 2x2x2 transposed convolution, then
    convolves the up-sampled features and the skip connection; last a 1x1x1 to the classes."""
    layers, channels = [], 1
    for level, width in enumerate((32, 64, 128, 256)):
        side = [size >> level] * 3
        layers += [ConvLayer(f"enc{level}.conv1", channels, width, 3, side, pad=1),
                   ConvLayer(f"enc{level}.conv2", width, 2 * width, 3, side, pad=1)]
        channels = 2 * width
    for level, width in reversed(list(enumerate((64, 128, 256)))):
        side = [size >> level] * 3
        layers += [ConvLayer(f"dec{level}.up", channels, channels, 2, [size >> (level + 1)] * 3, stride=2,
                             transposed=True),
                   ConvLayer(f"dec{level}.conv1", channels + width, width, 3, side, pad=1),
                   ConvLayer(f"dec{level}.conv2", width, width, 3, side, pad=1)]
        channels = width
    layers.append(ConvLayer("head", channels, classes, 1, [size] * 3))
    return Network("unet3d", tuple(layers), f"3-D U-Net, 1 channel of {size}^3 (3-D)", default_batch=2)


def wav2vec() -> Network:
    """wav2vec 2.0's feature encoder (Baevski et al., 2020): seven 1-D convolutions of 512
    channels over one second of 16 kHz audio."""
    layers, channels, length = [], 1, 16000
    for index, (kernel, stride) in enumerate(((10, 5), (3, 2), (3, 2), (3, 2), (3, 2), (2, 2), (2, 2))):
        layer = ConvLayer(f"conv{index}", channels, 512, kernel, [length], stride=stride)
        layers.append(layer)
        channels, (length,) = 512, layer.output_size
    return Network("wav2vec", tuple(layers), "wav2vec 2.0 feature encoder, one second of 16 kHz audio (1-D)",
                   default_batch=16)


BUILTIN = {"alexnet": alexnet, "resnet18": resnet18, "resnet50": resnet50, "densenet40": densenet40,
           "googlenet": googlenet, "c3d": c3d, "unet3d": unet3d, "wav2vec": wav2vec}
