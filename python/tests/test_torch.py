import pytest

torch = pytest.importorskip("torch")

import hoist  # noqa: E402

DTYPES = [torch.bool, torch.int8, torch.int16, torch.int32, torch.int64,
          torch.uint8, torch.uint16, torch.uint32, torch.uint64,
          torch.float16, torch.bfloat16, torch.float32, torch.float64,
          torch.float8_e4m3fn, torch.float8_e5m2]


def random_tensor(dtype, shape, seed):
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (int(torch.Size(shape).numel()) *
                                 torch.empty((), dtype=dtype).element_size(),),
                        dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        raw = raw % 2
    return raw.view(dtype).reshape(shape)


def same_bits(a, b):
    return (a.dtype == b.dtype and a.shape == b.shape and
            torch.equal(a.contiguous().reshape(-1).view(torch.uint8),
                        b.contiguous().reshape(-1).view(torch.uint8)))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_round_trips_bit_exact(root, dtype):
    state = {"a": random_tensor(dtype, (6, 4), 1),
             "t": random_tensor(dtype, (4, 6), 2).t(),  # not contiguous
             "scalar": random_tensor(dtype, (), 3)}
    with hoist.CheckpointManager(root, pool_bytes=8 << 20) as mgr:
        mgr.save(1, state).wait()
        for out in (mgr.restore(), mgr.restore(like=state)):
            for key in state:
                assert isinstance(out[key], torch.Tensor)
                assert same_bits(out[key], state[key]), key


def make_run(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 4)).to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, opt


def train_step(model, opt, step):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(32, 8, generator=g).to(torch.bfloat16)
    loss = model(x).float().pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def test_training_loop_checkpoints_every_step_and_resumes_bit_exact(root):
    model, opt = make_run(0)
    with hoist.CheckpointManager(root, keep=3, pool_bytes=8 << 20) as mgr:
        for step in range(1, 11):
            train_step(model, opt, step)
            mgr.save(step, {"model": model.state_dict(),
                            "opt": opt.state_dict(), "step": step})
        mgr.wait_until_finished()
        assert mgr.steps == [8, 9, 10]

        # A new process's view: fresh objects, resumed from step 8.
        resumed, resumed_opt = make_run(123)
        train_step(resumed, resumed_opt, 0)  # so the optimizer has state
        template = {"model": resumed.state_dict(),
                    "opt": resumed_opt.state_dict(), "step": 0}
        state = mgr.restore(8, like=template)
        assert state["step"] == 8
        resumed.load_state_dict(state["model"])
        resumed_opt.load_state_dict(state["opt"])
        for step in (9, 10):
            train_step(resumed, resumed_opt, step)
    for (name, a), b in zip(model.state_dict().items(),
                            resumed.state_dict().values()):
        assert same_bits(a, b), name
    for k, v in opt.state_dict()["state"].items():
        for key, value in v.items():
            assert same_bits(value, resumed_opt.state_dict()["state"][k][key])


def test_repeat_saves_of_state_dicts_take_the_repeat_path(root):
    """model.state_dict() (an OrderedDict) and the optimizer's (its
    param_groups lists and tuples of scalars), saved every step: every save
    after the first takes the repeat path, a learning rate changed in
    param_groups is saved with its step, parameters that need grad are
    taken as they are, and every step restores bit-exact. A dtype taken as
    bytes (bool, float8) or a changed structure walks the state whole."""
    from test_numpy import spy_repeats
    model, opt = make_run(0)
    snapshots = {}
    with hoist.CheckpointManager(root, pool_bytes=8 << 20) as mgr:
        repeated = spy_repeats(mgr)
        for step in range(1, 6):
            train_step(model, opt, step)
            if step == 3:
                opt.param_groups[0]["lr"] = 5e-3
            state = {"model": model.state_dict(), "opt": opt.state_dict(),
                     "live": dict(model.named_parameters()), "step": step}
            mgr.save(step, state).wait()
            snapshots[step] = ({k: v.clone() for k, v in
                                model.state_dict().items()},
                               opt.param_groups[0]["lr"])
        assert repeated == [False, True, True, True, True]
        assert any(p.requires_grad for p in state["live"].values())
        for step, (weights, lr) in snapshots.items():
            out = mgr.restore(step)
            assert out["step"] == step
            assert out["opt"]["param_groups"][0]["lr"] == lr
            assert out["opt"]["param_groups"][0]["betas"] == (0.9, 0.999)
            for name, want in weights.items():
                assert same_bits(out["model"][name], want), (step, name)
                assert same_bits(out["live"][name], want), (step, name)

        odd = {"flags": random_tensor(torch.bool, (8,), 1),
               "f8": random_tensor(torch.float8_e4m3fn, (8,), 2)}
        for step in (6, 7):
            mgr.save(step, odd).wait()
        mgr.save(8, {"w": torch.zeros(3)}).wait()
        mgr.save(9, {"w": torch.zeros(3, dtype=torch.float64)}).wait()
        assert repeated[5:] == [False, False, False, False]
        for key in odd:
            assert same_bits(mgr.restore(7)[key], odd[key])
        assert mgr.restore(9)["w"].dtype == torch.float64


def test_cuda_tensors_need_the_cuda_backend(root):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    with hoist.CheckpointManager(root, pool_bytes=8 << 20) as mgr:
        with pytest.raises(ValueError, match="backend='cuda'"):
            mgr.save(1, {"w": torch.zeros(4, device="cuda")})


def test_tensors_far_larger_than_the_pool_restore_into_aligned_memory(root):
    # 4 MiB and 3 MiB tensors (and a small one) through a 64 KiB pool:
    # restored tensors are hoist's own 4 KiB-aligned buffers, read into
    # directly, so the pool's size does not matter to them.
    state = {"w": random_tensor(torch.float32, (1024, 1024), 1),
             "e": random_tensor(torch.bfloat16, (1536, 1024), 2),
             "b": random_tensor(torch.float32, (7,), 3)}
    with hoist.CheckpointManager(root, pool_bytes=8 << 20) as mgr:
        mgr.save(1, state).wait()
    with hoist.CheckpointManager(root, pool_bytes=64 << 10) as mgr:
        like = {k: torch.empty_like(v) for k, v in state.items()}
        out = mgr.restore(like=like)
        assert mgr.last_restore["bytes_read"] >= 7 << 20
    for k, v in state.items():
        assert same_bits(out[k], v), k
        assert out[k].data_ptr() % 4096 == 0 or out[k].numel() < 1024, k
    out["w"][0, 0] = 5.0  # an ordinary, writable tensor
    assert float(out["w"][0, 0]) == 5.0


def test_empty_tensors_and_arrays_save_and_restore(root):
    """A module with an empty buffer (register_buffer("mask",
    torch.empty(0)): no data pointer), empty tensors and an empty NumPy
    array (strides (0, 0)) save beside the others and restore, in place
    too."""
    np = pytest.importorskip("numpy")
    model = torch.nn.Linear(3, 2)
    model.register_buffer("mask", torch.empty(0))
    state = {"model": model, "empty": torch.zeros(0, 5, dtype=torch.bfloat16),
             "np_empty": np.zeros((0, 3))}
    with hoist.CheckpointManager(root) as mgr:
        mgr.save(1, state).wait()
        got = mgr.restore(1)
        assert got["model"]["mask"].shape == (0,)
        assert got["empty"].shape == (0, 5)
        assert got["empty"].dtype == torch.bfloat16
        assert got["np_empty"].shape == (0, 3)
        assert torch.equal(got["model"]["weight"], model.weight.detach())
        fresh = torch.nn.Linear(3, 2)
        fresh.register_buffer("mask", torch.empty(0))
        mgr.restore(1, like={"model": fresh,
                             "empty": torch.ones(0, 5, dtype=torch.bfloat16),
                             "np_empty": np.ones((0, 3))})
    assert torch.equal(fresh.weight, model.weight)
    assert torch.equal(fresh.bias, model.bias)


class CastWeight(torch.Tensor):
    """A wrapper that keeps its values in one inner tensor of its own
    shape and dtype and casts them for its matmuls, as torchao's FSDP2
    float8 weight wrapper (WeightWithDynamicFloat8CastTensor) does."""

    @staticmethod
    def __new__(cls, tensor):
        out = torch.Tensor._make_wrapper_subclass(
            cls, tensor.shape, dtype=tensor.dtype, device=tensor.device)
        out._tensor = tensor
        return out

    def __tensor_flatten__(self):
        return ["_tensor"], None

    @staticmethod
    def __tensor_unflatten__(inner, meta, size, stride):
        return CastWeight(inner["_tensor"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        from torch.utils._pytree import tree_map_only
        return func(*tree_map_only(cls, lambda t: t._tensor, args),
                    **tree_map_only(cls, lambda t: t._tensor, kwargs or {}))


class ScaledFloat8(torch.Tensor):
    """float8 data and its scale, seen as float32 elements (their product),
    as torchao's Float8TrainingTensor and TransformerEngine's Float8Tensor
    are: its bytes are not its elements."""

    @staticmethod
    def __new__(cls, data, scale):
        out = torch.Tensor._make_wrapper_subclass(cls, data.shape,
                                                  dtype=torch.float32)
        out._data, out._scale = data, scale
        return out

    def __tensor_flatten__(self):
        return ["_data", "_scale"], None

    @staticmethod
    def __tensor_unflatten__(inner, meta, size, stride):
        return ScaledFloat8(inner["_data"], inner["_scale"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        from torch.utils._pytree import tree_map_only

        def value(t):
            return t._data.to(torch.float32) * t._scale
        return func(*tree_map_only(cls, value, args),
                    **tree_map_only(cls, value, kwargs or {}))


class Opaque(torch.Tensor):
    """A wrapper subclass that says nothing of what it holds."""

    @staticmethod
    def __new__(cls, shape):
        return torch.Tensor._make_wrapper_subclass(cls, shape,
                                                   dtype=torch.bfloat16)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(func)


def test_a_wrapper_that_keeps_its_values_in_one_tensor_round_trips(root):
    """Its one inner tensor is saved as it is (bit-exact), and loads back
    into a model whose weight is wrapped again."""
    weight = random_tensor(torch.bfloat16, (8, 4), 5)
    state = {"model": {"w": CastWeight(weight.clone())}}
    with hoist.CheckpointManager(root, pool_bytes=8 << 20) as mgr:
        mgr.save(1, state).wait()
        out = mgr.restore(like=state)["model"]["w"]
    assert same_bits(out, weight)
    target = CastWeight(torch.zeros(8, 4, dtype=torch.bfloat16))
    target.copy_(out)
    assert same_bits(target._tensor, weight)


@pytest.mark.parametrize("wrapper,named", [
    (lambda: ScaledFloat8(torch.randn(4, 4).to(torch.float8_e4m3fn),
                          torch.tensor(2.0)),
     "ScaledFloat8, a tensor subclass whose data is not its torch.float32 "
     "elements (its tensors _data, _scale)"),
    (lambda: Opaque((4, 4)), "Opaque, a tensor subclass whose data is not "
     "its torch.bfloat16 elements (no tensors hoist can read")],
    ids=["float8-and-scale", "opaque"])
def test_a_tensor_subclass_that_makes_its_own_data_is_refused_by_name(
        root, wrapper, named):
    """Refused before anything is written, naming the array and the type;
    the step committed before stays as it was."""
    plain = {"model": {"w": random_tensor(torch.float32, (4, 4), 6)}}
    with hoist.CheckpointManager(root, pool_bytes=8 << 20) as mgr:
        mgr.save(1, plain).wait()
        with pytest.raises(TypeError) as error:
            mgr.save(2, {"model": {"w": wrapper()}}).wait()
        assert "array 'model/w' is a" in str(error.value)
        assert named in str(error.value)
        assert mgr.steps == [1]
        assert same_bits(mgr.restore(1)["model"]["w"], plain["model"]["w"])


def _float8_model():
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    model = torch.nn.Sequential(torch.nn.Linear(32, 32),
                                torch.nn.Linear(32, 16))
    # FSDP2's float8 all-gather wraps each weight (torchao's
    # WeightWithDynamicFloat8CastTensor) even before fully_shard.
    return convert_to_float8_training(model, config=Float8LinearConfig(
        enable_fsdp_float8_all_gather=True))


def test_torchao_float8_training_weights_round_trip_and_float8_tensors_are_refused(
        root):
    pytest.importorskip("torchao")
    from torchao.float8.float8_scaling_utils import \
        hp_tensor_to_float8_dynamic
    from torchao.float8.float8_training_tensor import (GemmInputRole,
                                                       LinearMMConfig)
    torch.manual_seed(0)
    model, fresh = _float8_model(), _float8_model()
    wrapped = type(model.state_dict()["0.weight"]).__name__
    assert wrapped == "WeightWithDynamicFloat8CastTensor"
    with hoist.CheckpointManager(root, pool_bytes=8 << 20) as mgr:
        mgr.save(1, {"model": model.state_dict()}).wait()
        fresh.load_state_dict(
            mgr.restore(like={"model": fresh.state_dict()})["model"])
        for (key, a), b in zip(model.state_dict().items(),
                               fresh.state_dict().values()):
            assert same_bits(getattr(a, "_tensor", a),
                             getattr(b, "_tensor", b)), key

        weight = hp_tensor_to_float8_dynamic(
            torch.randn(16, 16), torch.float8_e4m3fn, LinearMMConfig(),
            gemm_input_role=GemmInputRole.WEIGHT)
        with pytest.raises(TypeError, match=(
                r"array 'opt/w' is a torchao\.float8\.float8_training_tensor"
                r"\.Float8TrainingTensor, .* \(its tensors _data, _scale\)")):
            mgr.save(2, {"opt": {"w": weight}}).wait()
        assert mgr.steps == [1]
