"""The boxes a tensor-parallel vLLM worker reads (hoist/integrations/
_vllm_boxes.py), found by running a model's load_weights on probes: here a
model whose loaders slice as vLLM's do for rank 1 of 2 (column- and
row-parallel narrows, fused QKV's parts, a replicated norm, a loader that
transposes). Each box is what the loaders narrowed to; what they do
otherwise reads the array whole; and loading from the boxes gives the
parameters loading whole arrays gives. Arrays the loaders only copy are
read straight into the parameter (their place), unless anything else
writes there; reading them there and loading the rest gives the same
parameters. The same at TP=2 in vLLM itself: test_vllm.py (long)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hoist.integrations import _vllm_boxes  # noqa: E402

RANK, TP = 1, 2
SAVED = {  # checkpoint name: shape
    "q.weight": (8, 6), "k.weight": (4, 6), "v.weight": (4, 6),
    "up.weight": (10, 6), "down.weight": (6, 10), "norm.weight": (6,),
    "head.weight": (6, 6),
}


class Model(torch.nn.Module):
    """vLLM's loaders in miniature, for tensor-parallel rank RANK of TP."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Parameter(torch.zeros(8, 6))  # (8 + 4 + 4) / 2
        self.up = torch.nn.Parameter(torch.zeros(5, 6))     # column-parallel
        self.down = torch.nn.Parameter(torch.zeros(6, 5))   # row-parallel
        self.norm = torch.nn.Parameter(torch.zeros(6))      # replicated
        self.head = torch.nn.Parameter(torch.zeros(6, 6))   # transposed

    def load_weights(self, weights):
        loaded = set()
        for name, w in weights:
            if name in ("q.weight", "k.weight", "v.weight"):
                size = w.shape[0] // TP
                offset = {"q.weight": 0, "k.weight": 4, "v.weight": 6}[name]
                part = self.qkv.data.narrow(0, offset, size)
                part.copy_(w.narrow(0, RANK * size, size))
                loaded.add("qkv")
            elif name == "up.weight":
                size = w.shape[0] // TP
                self.up.data.copy_(w.narrow(0, RANK * size, size))
            elif name == "down.weight":
                size = w.shape[1] // TP
                self.down.data.copy_(w.narrow(1, RANK * size, size))
            elif name == "norm.weight":
                assert self.norm.size() == w.size()
                self.norm.data.copy_(w)
            elif name == "head.weight":
                self.head.data.copy_(w.t())
            loaded.add(name)
        return loaded


def _saved():
    rng = np.random.default_rng(7)
    return {n: torch.from_numpy(rng.standard_normal(s).astype(np.float32))
            for n, s in SAVED.items()}


def _probe(model):
    arrays = {n: {"shape": list(s), "dtype": "float32"}
              for n, s in SAVED.items()}
    wanted = [(n, n) for n in SAVED]
    return _vllm_boxes.probe(model, wanted, arrays, lambda _: torch.float32)


def test_the_probe_finds_each_box_the_loaders_keep_and_changes_nothing():
    model = Model()
    uses = _probe(model)
    regions = {n: u.region() for n, u in uses.items()}
    assert regions["q.weight"] == ((4, 0), (4, 6))
    assert regions["k.weight"] == ((2, 0), (2, 6))
    assert regions["up.weight"] == ((5, 0), (5, 6))
    assert regions["down.weight"] == ((0, 5), (6, 5))
    # Copied whole, and transformed (read whole: what the loader reads of
    # it cannot be followed).
    assert regions["norm.weight"] == ((0,), (6,))
    assert uses["head.weight"].whole
    assert regions["head.weight"] == ((0, 0), (6, 6))
    for p in model.parameters():  # the probe pass copied nothing
        assert not p.detach().any()


def test_loading_the_boxes_gives_what_loading_whole_arrays_gives():
    saved = _saved()
    whole = Model()
    whole.load_weights(saved.items())
    boxed = Model()
    uses = _probe(boxed)
    placed = {}
    for name, tensor in saved.items():
        origin, extent = uses[name].region()
        box = tensor[tuple(slice(o, o + n) for o, n in zip(origin, extent))]
        raw = box.contiguous().numpy().reshape(-1).view(np.uint8).copy()
        placed[name] = _vllm_boxes.placed(raw, torch.float32, tensor.shape,
                                          origin, extent)
    boxed.load_weights(placed.items())
    for (name, a), (_, b) in zip(whole.named_parameters(),
                                 boxed.named_parameters()):
        assert torch.equal(a, b), name
    read = sum(np.prod(u.region()[1]) for u in uses.values())
    assert read < sum(np.prod(s) for s in SAVED.values())


def test_a_load_weights_that_fails_on_probes_reads_everything_whole():
    class Picky(Model):
        def load_weights(self, weights):
            for _, w in weights:
                w.numpy()  # data a probe does not have

    uses = _probe(Picky())
    assert all(u.whole for u in uses.values())


def _load_placed(model, saved, uses):
    """As the loader does: each placed array's box read into its place,
    the rest through load_weights (boxes in full-shape tensors)."""
    rest = {}
    for name, tensor in saved.items():
        origin, extent = uses[name].region()
        box = tensor[tuple(slice(o, o + n) for o, n in zip(origin, extent))]
        if uses[name].place is not None:
            place = uses[name].place.view(torch.uint8).numpy()
            place[...] = box.contiguous().view(torch.uint8).numpy().reshape(
                place.shape)
            continue
        raw = box.contiguous().numpy().reshape(-1).view(np.uint8).copy()
        rest[name] = _vllm_boxes.placed(raw, torch.float32, tensor.shape,
                                        origin, extent)
    return model.load_weights(rest.items())


def test_arrays_the_loaders_only_copy_are_placed_in_their_parameters():
    model = Model()
    uses = _probe(model)
    places = {n: u.place for n, u in uses.items()}
    qkv = model.qkv.data
    assert places["q.weight"].data_ptr() == qkv.data_ptr()
    assert places["k.weight"].data_ptr() == qkv[4].data_ptr()
    assert places["v.weight"].data_ptr() == qkv[6].data_ptr()
    assert places["up.weight"].data_ptr() == model.up.data_ptr()
    assert places["down.weight"].data_ptr() == model.down.data_ptr()
    assert places["norm.weight"].data_ptr() == model.norm.data_ptr()
    assert places["head.weight"] is None  # transposed: load_weights does it
    assert _vllm_boxes.parameters_placed(model, uses) == {
        "qkv", "up", "down", "norm"}

    saved = _saved()
    whole = Model()
    whole.load_weights(saved.items())
    _load_placed(model, saved, uses)
    for (name, a), (_, b) in zip(whole.named_parameters(),
                                 model.named_parameters()):
        assert torch.equal(a, b), name


def test_a_parameter_something_else_writes_is_not_placed():
    class Scaled(Model):
        """Scales the norm after copying it, zero-fills the head's spare
        row first and pads up's rows past the copy (as vLLM's vocabulary
        loader pads): only what another write overlaps loses its place."""

        def __init__(self):
            super().__init__()
            self.up = torch.nn.Parameter(torch.zeros(7, 6))

        def load_weights(self, weights):
            for name, w in weights:
                if name == "norm.weight":
                    self.norm.data.copy_(w)
                    self.norm.data.mul_(2)
                elif name == "up.weight":
                    size = w.shape[0] // TP
                    self.up[:size].data.copy_(w.narrow(0, RANK * size, size))
                    self.up[size:].data.fill_(0)
                elif name == "q.weight":
                    self.qkv.data.zero_()
                    size = w.shape[0] // TP
                    self.qkv.data.narrow(0, 0, size).copy_(
                        w.narrow(0, RANK * size, size))
            return {"norm", "up", "qkv"}

    model = Scaled()
    uses = _probe(model)
    assert uses["norm.weight"].place is None
    assert uses["q.weight"].place is None
    assert uses["up.weight"].place is not None
    saved = _saved()
    whole = Scaled()
    whole.load_weights(saved.items())
    _load_placed(model, saved, uses)
    for (name, a), (_, b) in zip(whole.named_parameters(),
                                 model.named_parameters()):
        assert torch.equal(a, b), name


def test_two_arrays_copied_to_one_place_are_neither_placed():
    class Tied(Model):
        def load_weights(self, weights):
            for name, w in weights:
                if name in ("norm.weight", "head.weight"):
                    self.norm.data.copy_(w[0] if w.dim() == 2 else w)
            return {"norm"}

    uses = _probe(Tied())
    assert uses["norm.weight"].place is None
    assert uses["head.weight"].place is None


def test_a_load_weights_that_fails_on_probes_places_nothing():
    class Late(Model):
        def load_weights(self, weights):
            for name, w in weights:
                if name == "norm.weight":
                    self.norm.data.copy_(w)
                else:
                    w.numpy()

    uses = _probe(Late())
    assert all(u.place is None for u in uses.values())
