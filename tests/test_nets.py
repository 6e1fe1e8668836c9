"""Built-in networks, network files and the registry."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from ucudnn.core.errors import ConfigError
from ucudnn.core.nets import (
    ConvLayer,
    Network,
    find_kernel,
    get_network,
    list_networks,
    load_network,
    torchvision as tv,
)
from ucudnn.core.problem import ConvKind


def layer(network: Network, name: str) -> ConvLayer:
    return next(x for x in network.layers if x.name == name)


@pytest.mark.parametrize("name, conv_layers, distinct", [
    ("alexnet", 5, 5), ("resnet18", 20, 11), ("resnet50", 53, 23), ("densenet40", 39, 39), ("googlenet", 57, 49),
])
def test_builtin_networks_have_the_papers_layer_counts(name, conv_layers, distinct):
    network = get_network(name)
    assert (network.conv_layers, len(network.layers)) == (conv_layers, distinct)
    assert len({x.geometry for x in network.layers}) == distinct  # identical layers are merged


def test_alexnet_is_caffes_single_column_network():
    net = get_network("alexnet")
    assert [(x.in_channels, x.out_channels, x.kernel[0], x.output_size[0]) for x in net.layers] == [
        (3, 96, 11, 55), (96, 256, 5, 27), (256, 384, 3, 13), (384, 384, 3, 13), (384, 256, 3, 13)]
    assert {x.groups for x in net.layers} == {1}


def test_resnet50_follows_torchvision():
    net = get_network("ResNet-50")  # names are matched loosely
    assert layer(net, "layer2.0.conv2").stride == (2, 2)  # stride in the 3x3 conv (v1.5)
    downsamples = [x for x in net.layers if "downsample" in x.name]
    assert [(x.in_channels, x.out_channels, x.stride) for x in downsamples] == [
        (256, 512, (2, 2)), (512, 1024, (2, 2)), (1024, 2048, (2, 2))]
    # layer1's downsample has conv3's geometry exactly: counted with it
    assert layer(net, "layer1.0.conv3").count == 4
    assert layer(net, "layer3.1.conv2").count == 5
    assert net.layers[-1].output_size == (7, 7) and layer(net, "layer4.0.conv3").out_channels == 2048


def test_densenet40_grows_by_k_and_keeps_channels_through_transitions():
    net = get_network("densenet40")
    assert layer(net, "block1.layer12").in_channels == 16 + 11 * 40
    assert (layer(net, "transition1").in_channels, layer(net, "transition1").out_channels) == (496, 496)
    assert layer(net, "block3.layer1").input_size == (8, 8)
    assert layer(net, "block3.layer12").in_channels == 976 + 11 * 40


def test_googlenet_modules_take_the_previous_modules_concatenation():
    net = get_network("googlenet")
    assert layer(net, "inception_3a/1x1").in_channels == 192
    assert layer(net, "inception_4a/1x1").in_channels == 480
    assert layer(net, "inception_5a/3x3_reduce").in_channels == 832
    assert layer(net, "inception_5b/5x5").kernel == (5, 5)


def test_problems_give_every_kind_of_every_distinct_layer():
    net = get_network("resnet18")
    kernels = net.problems(32, "float16", "fma", "nhwc")
    assert len(kernels) == 3 * len(net.layers)
    assert len({k.problem.key for k in kernels}) == len(kernels)
    assert {k.problem.kind for k in kernels} == set(ConvKind)
    assert {(k.problem.batch, k.problem.dtype, k.problem.math, k.problem.layout) for k in kernels} == {
        (32, "float16", "fma", "nhwc")}
    assert sum(k.count for k in kernels) == 3 * net.conv_layers
    assert find_kernel(kernels, "conv1/BD").problem.kind is ConvKind.BACKWARD_DATA
    with pytest.raises(ConfigError, match="conv9/F"):
        find_kernel(kernels, "conv9/F")


def test_network_files_round_trip(tmp_path):
    for network in list_networks():
        path = tmp_path / f"{network.name}.json"
        path.write_text(json.dumps(network.to_json()))
        assert get_network(str(path)) == network


def test_network_file_with_rectangular_and_repeated_layers(tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps({"name": "tiny", "layers": [
        {"name": "a", "in_channels": 3, "out_channels": 8, "kernel": [3, 1], "input_size": [32, 16], "pad": [1, 0]},
        {"name": "b", "in_channels": 8, "out_channels": 8, "kernel": 3, "input_size": 32, "pad": 1, "count": 2},
        {"name": "c", "in_channels": 8, "out_channels": 8, "kernel": 3, "input_size": 32, "pad": 1},
    ]}))
    net = load_network(path)
    assert [(x.name, x.count) for x in net.layers] == [("a", 1), ("b", 3)]
    assert layer(net, "a").output_size == (32, 16)


@pytest.mark.parametrize("content, message", [
    ("{not json", "cannot be read"),
    ('{"layers": 3}', "a network file is a JSON object"),
    ('{"layers": [{"name": "a", "in_channels": 3}]}', "layer a lacks input_size, kernel, out_channels; a layer has"),
    ('{"layers": [{"name": "a", "in_channels": 3, "out_channels": 8, "kernel": 3, "input_size": 8, "colour": 1}]}',
     "layer a has an unknown key colour; a layer has the keys"),
    ('{"layers": [3]}', "layer 3 is not a JSON object; a layer has the keys"),
    ('{"layers": [{"name": "a", "in_channels": 3, "out_channels": 8, "kernel": 3, "input_size": 8, "groups": 2}]}',
     "layer a"),
    ('{"layers": [{"name": "a", "in_channels": 3, "out_channels": 8, "kernel": 9, "input_size": 4}]}', "empty"),
    ('{"layers": []}', "no convolution layers"),
])
def test_bad_network_files_name_the_file_and_the_problem(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message) as error:
        get_network(str(path))
    assert str(path) in str(error.value)


def test_unknown_networks_and_files():
    with pytest.raises(ConfigError, match="does not exist"):
        get_network("/nonexistent/net.json")
    if not tv.available():
        with pytest.raises(ConfigError, match="alexnet, resnet18"):
            get_network("nosuchnet")
        with pytest.raises(ConfigError, match="vgg16.*pip install torch"):
            get_network("torchvision:vit_b_16")  # not shipped


@pytest.mark.skipif(not tv.available(), reason=f"{' and '.join(tv.missing_packages())} not installed")
def test_traced_torchvision_resnet50_matches_the_builtin_table():
    traced, builtin = get_network("torchvision:resnet50"), get_network("resnet50")
    assert {x.geometry: x.count for x in traced.layers} == {x.geometry: x.count for x in builtin.layers}
    with pytest.raises(ConfigError, match="no model"):
        get_network("torchvision:nosuchnet")


def test_shipped_torchvision_tables_load_without_torch():
    code = ("import sys; from ucudnn.core.nets import get_network; n = get_network('torchvision:alexnet'); "
            "v = get_network('vgg16'); print(len(n.layers), v.conv_layers, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.stdout.split() == ["5", "13", "False"]


def test_shipped_torchvision_alexnet_is_torchvisions_geometry():
    layers = get_network("torchvision:alexnet").layers
    assert [(x.in_channels, x.out_channels, x.kernel[0], x.input_size[0], x.stride[0], x.pad[0]) for x in layers] == [
        (3, 64, 11, 224, 4, 2), (64, 192, 5, 27, 1, 2), (192, 384, 3, 13, 1, 1), (384, 256, 3, 13, 1, 1),
        (256, 256, 3, 13, 1, 1)]


def test_shipped_torchvision_resnet50_matches_the_builtin_table():
    shipped, builtin = get_network("torchvision:resnet50"), get_network("resnet50")
    assert {x.geometry: x.count for x in shipped.layers} == {x.geometry: x.count for x in builtin.layers}


def test_the_shipped_tables_are_the_common_models():
    """`python3 -m ucudnn.core.nets.torchvision` traces tv.COMMON into the shipped file."""
    assert sorted(tv.shipped_names()) == sorted(tv.COMMON)


def test_write_shipped_writes_the_traced_tables(tmp_path, monkeypatch):
    monkeypatch.setattr(tv, "tables", lambda names: {"torchvision": "x", "networks": dict.fromkeys(names)})
    content = tv.write_shipped(tmp_path / "tables.json")
    assert json.loads((tmp_path / "tables.json").read_text()) == content and list(content["networks"]) == list(tv.COMMON)


@pytest.mark.skipif(not tv.available(), reason=f"{' and '.join(tv.missing_packages())} not installed")
@pytest.mark.parametrize("name", tv.shipped_names())
def test_shipped_torchvision_tables_equal_a_fresh_trace(name):
    assert tv.network(name).layers == tv.trace(name).layers


def test_layers_of_one_to_three_spatial_dimensions():
    """A layer's dimensions are its longest list of sizes; a file keeps them (a 3-D cube's input
    size as a list); a 1-D layer's kernels are the 2-D problems cuDNN runs, height 1."""
    cube = ConvLayer("c", 4, 8, 3, [8, 8, 8], pad=1, stride=[1, 2, 2])
    assert (cube.kernel, cube.stride, cube.output_size) == ((3, 3, 3), (1, 2, 2), (8, 4, 4))
    line = ConvLayer("l", 1, 16, 10, [1000], stride=5)
    assert line.output_size == (199,)
    problem = line.problem("F", 4)
    assert problem.x_shape == (4, 1, 1, 1000) and problem.w_shape == (16, 1, 1, 10)
    assert (problem.pads, problem.strides, problem.y_shape) == ((0, 0), (1, 5), (4, 16, 1, 199))
    net = Network("n", (cube, line))
    assert Network.from_json(json.loads(json.dumps(net.to_json()))) == net
    assert net.to_json()["layers"][0]["input_size"] == [8, 8, 8] and net.to_json()["layers"][0]["kernel"] == 3
    with pytest.raises(ConfigError, match=r"layer bad: kernel=\[3, 3\] must be an integer or 3 integers \[depth"):
        ConvLayer("bad", 1, 1, [3, 3], [8, 8, 8])
    with pytest.raises(ConfigError, match=r"input_size=\[8, 8, 8, 8\] has 4 values.* one per spatial dimension"):
        ConvLayer("bad", 1, 1, 1, [8, 8, 8, 8])


@pytest.mark.parametrize("name, value", [("stride", [1, 2, 3, 4]), ("input_size", [8] * 5), ("pad", []),
                                         ("dilation", (1, 1, 1, 1))])
def test_a_list_of_sizes_no_layer_has_is_named_itself(name, value):
    """A stride of four values was reported as the kernel's fault ("kernel=5 must be ..."): the
    list of a length no layer has is named, with the lengths a list may have."""
    layer = {"name": "c", "in_channels": 3, "out_channels": 8, "kernel": 5, "input_size": 32}
    with pytest.raises(ConfigError) as error:
        ConvLayer(**{**layer, name: value})
    message = str(error.value)
    assert message.startswith(f"layer c: {name}={list(value)} has {len(value)} values; a size is an integer or a "
                              "list of 1, 2 or 3") and "kernel" not in message and "\n" not in message


def test_a_transposed_layer_has_the_kernels_of_the_convolution_it_transposes():
    """A DCGAN up-convolution: its kernels are those of the convolution from its output back to
    its input (x the layer's output, w its weight); a file keeps it; bad ones name the fix."""
    up = ConvLayer("up", 256, 128, 4, 16, stride=2, pad=1, transposed=True)
    assert up.output_size == (32, 32)
    problem = up.problem("BD", 8)
    assert problem.x_shape == (8, 128, 32, 32) and problem.w_shape == (256, 128, 4, 4)
    assert problem.y_shape == (8, 256, 16, 16)  # the layer's input: its forward is this BD
    odd = ConvLayer("odd", 4, 6, 3, [5, 7], stride=2, pad=1, output_padding=[1, 0], groups=2, transposed=True)
    assert odd.output_size == (10, 13) and odd.problem("F", 1).y_shape[2:] == (5, 7)
    net = Network("gan", (up, odd, ConvLayer("conv", 3, 8, 3, 16)))
    data = net.to_json()
    assert "transposed" not in data["layers"][2] and data["layers"][1]["output_padding"] == [1, 0]
    assert Network.from_json(json.loads(json.dumps(data))) == net
    with pytest.raises(ConfigError, match="output_padding=\\[1, 1\\] is a transposed layer's"):
        ConvLayer("bad", 1, 1, 3, 8, stride=2, output_padding=1)
    with pytest.raises(ConfigError, match="must be below stride"):
        ConvLayer("bad", 1, 1, 3, 8, stride=1, dilation=2, output_padding=1, transposed=True)


def test_one_name_for_two_shapes_is_refused_in_the_words_wd_refuses_kernels_in():
    """Layers of one name share their kernels' names, and so one plan: a network refuses them as
    it is made, for every optimizer, with the rule WD checks its kernels by (problem.check_unique_names)."""
    from ucudnn.optimizers.wd import optimize_wd

    first, second = ConvLayer("a", 3, 8, 3, 32), ConvLayer("a", 3, 8, 3, 64)
    with pytest.raises(ConfigError) as layers:
        Network("twice", (first, second))
    assert str(layers.value) == ("layer names ['a'] occur more than once; give every layer its own name, or one "
                                 "layer a count for identical occurrences")
    kernels = [k for layer in (first, second) for k in Network("one", (layer,)).problems(8)]
    with pytest.raises(ConfigError) as wd:
        optimize_wd(kernels, {}, (8,), 2**20)
    assert str(wd.value) == str(layers.value).replace("layer", "kernel").replace("['a']", "['a/BD', 'a/BF', 'a/F']")
    assert Network("once", (first, first)).layers == (replace(first, count=2),)
