"""A damaged or crafted model file is one ModelFileError line, and costs no memory it declares.

Each case starts from a real model file (:func:`scalegnn.trained.save_model`, or a
compared system's :func:`save_system_model`), changes one thing in its payload and writes
it back with ``torch.save``: :func:`scalegnn.load_model` must refuse it with one line that
names the file and matches what is wrong, before building the module (declared sizes are
checked against a 2G memory budget, and any large allocation fails the test).
"""

from __future__ import annotations

import copy
import time

import pytest
import torch

from scalegnn.fileio import MEMORY_BUDGET_ENV
from scalegnn.model import ModelConfig, ScaleGNN
from scalegnn.trained import ModelFileError, load_model, save_model, save_system_model

IN, CLASSES, HIDDEN, LAYERS = 5, 3, 4, 2


@pytest.fixture(autouse=True)
def small_budget(monkeypatch):
    """A 2G budget, and no allocation of more than a million entries: a size the file declares
    must be refused from its numbers, not discovered by the allocator."""
    monkeypatch.setenv(MEMORY_BUDGET_ENV, "2G")
    for name in ("empty", "rand", "ones", "zeros"):
        real = getattr(torch, name)

        def guarded(*size, _real=real, _name=name, **kw):
            dims = size[0] if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else size
            n = 1
            for d in dims:
                n *= int(d)
            if kw.get("device") != "meta" and torch.get_default_device().type != "meta":
                assert n <= 10**6, f"torch.{_name} of {n:,} entries: the declared size was not checked first"
            return _real(*size, **kw)

        monkeypatch.setattr(torch, name, guarded)


@pytest.fixture(scope="module")
def scalegnn_payload(tmp_path_factory) -> dict:
    model = ScaleGNN(IN, CLASSES, ModelConfig(hidden=HIDDEN, layers=LAYERS))
    path = save_model(tmp_path_factory.mktemp("good") / "good.pt", model.state_dict(), in_dim=IN,
                      num_classes=CLASSES, model_cfg=model.config, about={"run_id": "r1"})
    assert isinstance(load_model(path), ScaleGNN)  # the file the cases damage loads as it is
    return torch.load(path, weights_only=True)


@pytest.fixture(scope="module")
def system_payload(tmp_path_factory) -> dict:
    from scalegnn.baselines.models import SAGENet

    model = SAGENet(IN, HIDDEN, CLASSES, LAYERS, 0.5)
    path = save_system_model(tmp_path_factory.mktemp("good") / "sage.pt", "graphsage", model.architecture,
                             model.state_dict(), about={"run_id": "r2"})
    loaded = load_model(path)
    assert isinstance(loaded, SAGENet) and loaded.architecture == model.architecture
    return torch.load(path, weights_only=True)


def refused(tmp_path, payload, match: str) -> str:
    path = tmp_path / "bad.pt"
    torch.save(payload, path)
    t0 = time.perf_counter()
    with pytest.raises(ModelFileError, match=match) as err:
        load_model(path)
    assert time.perf_counter() - t0 < 1.0
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{path}: ")
    return message


def _set(*keys, value):
    def change(p):
        holder = p
        for k in keys[:-1]:
            holder = holder[k]
        holder[keys[-1]] = value
    return change


def _drop(*keys):
    def change(p):
        holder = p
        for k in keys[:-1]:
            holder = holder[k]
        del holder[keys[-1]]
    return change


def _fill(name, value, where=(0, 0)):
    def change(p):
        p["state"][name][where] = value
    return change


SCALEGNN_CASES = [
    # missing fields
    ("no-in-dim", _drop("in_dim"), r"'in_dim' is missing; write it again"),
    ("no-num-classes", _drop("num_classes"), r"'num_classes' is missing"),
    ("no-model", _drop("model"), r"'model' \(the architecture\) is missing"),
    ("no-state", _drop("state"), r"'state' \(the parameters\) is missing"),
    ("no-format", _drop("format"), r"'format' is None, not a model format"),
    ("no-kind", _drop("kind"), r"not a scalegnn model file: its kind is None"),
    # wrong types
    ("in-dim-str", _set("in_dim", value="8"), r"'in_dim' is '8' \(str\), not an integer >= 1"),
    ("in-dim-bool", _set("in_dim", value=True), r"'in_dim' is True \(bool\), not an integer"),
    ("in-dim-float", _set("in_dim", value=5.0), r"'in_dim' is 5.0 \(float\), not an integer"),
    ("num-classes-none", _set("num_classes", value=None), r"'num_classes' is None \(NoneType\)"),
    ("model-list", _set("model", value=[1]), r"'model' \(the architecture\) is \[1\] \(list\), not a dict"),
    ("state-list", _set("state", value=[1]), r"'state' \(the parameters\) is \[1\] \(list\), not a dict"),
    ("hidden-str", _set("model", "hidden", value="4"), r"model.hidden is '4' \(str\), not an integer"),
    ("norm-str", _set("model", "norm", value="yes"), r"model.norm is 'yes' \(str\), not True or False"),
    ("dropout-nan", _set("model", "dropout", value=float("nan")), r"model.dropout is nan, not a finite number"),
    ("format-str", _set("format", value="1"), r"'format' is '1', not a model format"),
    ("format-newer", _set("format", value=99), r"model format 99 is newer than this scalegnn reads"),
    ("about-str", _set("about", value="x"), r"'about' is 'x' \(str\), not a dict"),
    ("unknown-kind", _set("kind", value="other"), r"not a scalegnn model file: its kind is 'other'"),
    # out of range
    ("in-dim-0", _set("in_dim", value=0), r"'in_dim' is 0, not a size >= 1"),
    ("hidden-0", _set("model", "hidden", value=0), r"model.hidden is 0, not a size >= 1"),
    ("hidden-negative", _set("model", "hidden", value=-4), r"model.hidden is -4, not a size >= 1"),
    ("layers-0", _set("model", "layers", value=0), r"model.layers is 0, not a size >= 1"),
    ("dropout-1.5", _set("model", "dropout", value=1.5), r"'model' is not an architecture \(dropout must be"),
    ("norm-position", _set("model", "norm_position", value="mid"), r"'model' is not an architecture"),
    ("norm-eps-negative", _set("model", "norm_eps", value=-1.0), r"model.norm_eps is -1.0, not >= 0"),
    # declared sizes past the memory budget, refused before anything is built
    ("in-dim-2^40", _set("in_dim", value=2**40), r"in_dim x model.hidden declares 4,398,046,511,104 entries "
     r"\(16.0 TiB\), more than the memory budget of 2.0 GiB"),
    ("hidden-2^20", _set("model", "hidden", value=2**20), r"model.layers x model.hidden\^2 declares .* more than "
     r"the memory budget"),
    ("classes-2^40", _set("num_classes", value=2**40), r"model.hidden x num_classes declares .* memory budget"),
    # within the budget, but more layers than the state has entries: refused before they are listed
    ("layers-10^7", _set("model", "layers", value=10**7),
     r"'state' holds 6 entries, its architecture \(in_dim 5, hidden 4, 10000000 layers, 3 classes\) has 20000002"),
    # the state against the architecture
    ("state-missing-w1", _drop("state", "w.1"), r"'state' holds 5 entries, its architecture .* has 6"),
    ("state-extra", _set("state", "bias", value=torch.zeros(3)), r"'state' holds 7 entries"),
    ("state-renamed", lambda p: p["state"].__setitem__("w.9", p["state"].pop("w.1")),
     r"'state' holds 'w.9', which its architecture .* has not \(it has w_in, w.0"),
    ("w-in-shape", _set("state", "w_in", value=torch.zeros(6, HIDDEN)),
     r"state w_in has shape \(6, 4\), its architecture \(in_dim 5, hidden 4, 2 layers, 3 classes\) makes it \(5, 4\)"),
    ("w-in-int", _set("state", "w_in", value=torch.zeros(IN, HIDDEN, dtype=torch.int64)),
     r"state w_in holds torch.int64 values, not floating point ones"),
    ("w-in-bool", _set("state", "w_in", value=torch.zeros(IN, HIDDEN, dtype=torch.bool)),
     r"state w_in holds torch.bool values"),
    ("w-in-sparse", _set("state", "w_in", value=torch.zeros(IN, HIDDEN).to_sparse()),
     r"state w_in is a torch.sparse_coo tensor, not a dense one"),
    ("w-in-list", _set("state", "w_in", value=[[0.0] * HIDDEN] * IN),
     r"state w_in is \[\[0.0, .*\(list\), not a tensor"),
    ("norm-without-norm", _set("model", "norm", value=False), r"'state' holds 6 entries, its architecture "
     r"\(in_dim 5, hidden 4, 2 layers without norm, 3 classes\) has 4"),
    # non-finite weights
    ("w-in-nan", lambda p: p["state"]["w_in"].fill_(float("nan")),
     r"state w_in has 20 non-finite values \(NaN or inf\) of 20: a model that predicts NaN; the run that trained "
     r"it diverged"),
    ("w1-inf", _fill("w.1", float("inf")), r"state w.1 has 1 non-finite values"),
    ("norm-neg-inf", _fill("norm.0", float("-inf"), where=(2,)), r"state norm.0 has 1 non-finite values"),
]


@pytest.mark.parametrize("change,match", [c[1:] for c in SCALEGNN_CASES], ids=[c[0] for c in SCALEGNN_CASES])
def test_a_damaged_scalegnn_model_file_is_one_line(tmp_path, scalegnn_payload, change, match):
    payload = copy.deepcopy(scalegnn_payload)
    change(payload)
    refused(tmp_path, payload, match)


SYSTEM_CASES = [
    ("no-architecture", _drop("architecture"), r"'architecture' is missing"),
    ("architecture-list", _set("architecture", value=[1]), r"'architecture' is \[1\] \(list\), not a dict"),
    ("unknown-key", _set("architecture", "heads", value=2),
     r"architecture key 'heads' is not one of SAGENet's \(in_dim, hidden, out_dim, layers, dropout, conv\)"),
    ("no-hidden", _drop("architecture", "hidden"), r"architecture.hidden is missing"),
    ("hidden-str", _set("architecture", "hidden", value="8"), r"architecture.hidden is '8' \(str\), not an integer"),
    ("hidden-negative", _set("architecture", "hidden", value=-1), r"architecture.hidden is -1, not a size >= 1"),
    ("dropout-2", _set("architecture", "dropout", value=2.0), r"architecture.dropout is 2.0, not in \[0, 1\)"),
    ("conv-unknown", _set("architecture", "conv", value="gat"),
     r"its architecture \(.*conv gat\) builds no SAGENet \(unknown convolution 'gat'"),
    ("in-dim-2^40", _set("architecture", "in_dim", value=2**40),
     r"architecture \(in_dim 1099511627776, .*\) declares .* more than the memory budget of 2.0 GiB"),
    ("layers-10^9", _set("architecture", "layers", value=10**9),
     r"architecture.layers is 1,000,000,000, more than the 6 entries of 'state'"),
    ("no-system", _drop("system"), r"'system' is missing"),
    ("system-int", _set("system", value=3), r"'system' is 3 \(int\), not a string"),
    ("system-unknown", _set("system", value="nope"), r"a model of system 'nope', which has no model class here"),
    ("system-scalegnn", _set("system", value="scalegnn"),
     r"a scalegnn model is saved as a ScaleGNN model file \(kind 'scalegnn-model'\)"),
    ("state-shape", _set("state", "first.conv.lin_l.weight", value=torch.zeros(HIDDEN, IN + 1)),
     r"state first.conv.lin_l.weight has shape \(4, 6\), its architecture .* makes it \(4, 5\)"),
    ("state-int", _set("state", "convs.0.lin_l.bias", value=torch.zeros(CLASSES, dtype=torch.int32)),
     r"state convs.0.lin_l.bias holds torch.int32 values"),
    ("state-missing", _drop("state", "convs.0.lin_l.bias"), r"'state' holds 5 entries, its architecture .* has 6"),
    ("nan", _fill("convs.0.lin_r.weight", float("nan")), r"state convs.0.lin_r.weight has 1 non-finite values"),
]


@pytest.mark.parametrize("change,match", [c[1:] for c in SYSTEM_CASES], ids=[c[0] for c in SYSTEM_CASES])
def test_a_damaged_compared_system_model_file_is_one_line(tmp_path, system_payload, change, match):
    payload = copy.deepcopy(system_payload)
    change(payload)
    refused(tmp_path, payload, match)


@pytest.mark.parametrize("payload,match", [
    ([1, 2, 3], r"not a scalegnn model file: it holds \[1, 2, 3\] \(list\), not a model's dict"),
    (torch.zeros(3, 3), r"not a scalegnn model file: it holds a torch.float32 tensor of shape \(3, 3\)"),
    ("scalegnn-model", r"not a scalegnn model file: it holds 'scalegnn-model' \(str\)"),
], ids=["list", "tensor", "str"])
def test_a_payload_that_is_no_dict_is_one_line(tmp_path, payload, match):
    refused(tmp_path, payload, match)


def test_a_truncated_model_file_is_one_line(tmp_path, scalegnn_payload):
    whole = tmp_path / "whole.pt"
    torch.save(scalegnn_payload, whole)
    data = whole.read_bytes()
    for keep in (len(data) // 2, 10):
        path = tmp_path / f"cut{keep}.pt"
        path.write_bytes(data[:keep])
        with pytest.raises(ModelFileError, match="cannot be read as a model file") as err:
            load_model(path)
        assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_a_model_file_of_another_version_keeps_loading(tmp_path, scalegnn_payload):
    """ModelConfig.from_dict's tolerance stays: a key of another version is left out, a field
    the file lacks keeps its default; only what is kept is checked."""
    payload = copy.deepcopy(scalegnn_payload)
    payload["model"]["future_switch"] = "anything"
    del payload["model"]["norm_eps"]
    payload["format"] = 1
    torch.save(payload, tmp_path / "old.pt")
    model = load_model(tmp_path / "old.pt")
    assert model.about == {"run_id": "r1"} and not model.training
    for name, value in scalegnn_payload["state"].items():
        assert torch.equal(model.state_dict()[name], value)
