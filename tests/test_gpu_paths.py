"""The CPU-visible half of the GPU-only paths (issue 28): which weight transfer `auto` picks,
what an IPC update looks like on vLLM's engine-core messaging, the one-sender IPC trainer, the
engine defaults on a GPU, the context length against the model's positions, the router's sleep.
What only a GPU shows is in scripts/gpu_check.py and scripts/gpu_engine_check.py."""

import pickle

import pytest
import torch

from agent.engines.base import ContextTooLong, check_context, context_limit, rope_scaling_of
from agent.engines.vllm import vllm_available

vllm_only = pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")


def cuda(monkeypatch, available: bool) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)


# ---- which transfer, and the engine's defaults ----

@vllm_only
def test_auto_transfer_is_ipc_only_for_an_engine_on_one_gpu(monkeypatch):
    from agent.engines.vllm_async import resolve_transfer

    cuda(monkeypatch, True)
    assert resolve_transfer("auto") == "ipc"
    # tensor parallel: rank 0's weights sit on its GPU alone, an IPC handle opens only there
    assert resolve_transfer("auto", tensor_parallel=2) == "inline"
    with pytest.raises(ValueError, match="tensor_parallel_size=2"):
        resolve_transfer("ipc", tensor_parallel=2)
    cuda(monkeypatch, False)
    assert resolve_transfer("auto") == "inline"
    for backend in ("ipc", "nccl"):
        with pytest.raises(ValueError, match="needs CUDA"):
            resolve_transfer(backend)


@vllm_only
def test_engine_defaults_on_a_gpu_and_on_cpu(monkeypatch):
    from agent.engines.base import engine_defaults

    cuda(monkeypatch, True)
    gpu = engine_defaults({"dtype": "auto", "gpu_memory_utilization": None})
    assert gpu == {"dtype": "bfloat16", "enforce_eager": False, "gpu_memory_utilization": 0.9}
    assert engine_defaults({"gpu_memory_utilization": 0.4, "enforce_eager": True})["gpu_memory_utilization"] == 0.4
    cuda(monkeypatch, False)
    assert engine_defaults({}) == {"dtype": "float32", "enforce_eager": True, "gpu_memory_utilization": 0.15}


# ---- an IPC update on vLLM's messaging ----

def cuda_ipc_args():
    """What torch.multiprocessing.reductions.reduce_tensor gives for a CUDA tensor (its second
    item, torch 2.13's `reduce_tensor`): the tensor's class, size, stride, offset, the storage's
    class, dtype, device index, the IPC handle and the refcount and event handles. Built by hand:
    there is no CUDA here."""
    return (torch.Tensor, torch.Size([4, 8]), (8, 1), 0, torch.storage.UntypedStorage, torch.bfloat16, 0,
            b"\x01" * 64, 64, 0, False, b"\x02" * 16, 0, b"\x03" * 64, True)


@vllm_only
def test_ipc_handles_cross_vllms_engine_messaging_only_pickled(monkeypatch):
    """vLLM's engine-core messaging (msgpack) refuses tensor classes and dtypes unless insecure
    serialization is on (finding 1: the first IPC sync raised there). The update as sent travels
    (the handles pickled, as vLLM's HTTP client does) and the worker's update info reads them back."""
    from vllm.distributed.weight_transfer.ipc_engine import IPCWeightTransferUpdateInfo
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    from agent.engines.vllm_transfer import wire_update_info

    monkeypatch.delenv("VLLM_ALLOW_INSECURE_SERIALIZATION", raising=False)
    update = {"names": ["w"], "dtype_names": ["bfloat16"], "shapes": [[4, 8]], "tensor_sizes": [64],
              "ipc_handles": {"GPU-uuid": cuda_ipc_args()}}
    with pytest.raises(TypeError, match="not serializable"):
        MsgpackEncoder().encode(update)
    wired = wire_update_info(update)
    decoded = MsgpackDecoder().decode(MsgpackEncoder().encode(wired))
    with pytest.raises(ValueError, match="VLLM_ALLOW_INSECURE_SERIALIZATION"):
        IPCWeightTransferUpdateInfo(**decoded)
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # as the engine is started under ipc
    info = IPCWeightTransferUpdateInfo(**decoded)
    assert pickle.dumps(info.ipc_handles) == pickle.dumps(update["ipc_handles"])
    # inline updates carry only plain fields and pass as they are
    plain = {"names": ["w"], "dtype_names": ["float32"], "shapes": [[1]], "buffer": b"\0" * 4}
    assert wire_update_info(plain) == plain


@vllm_only
def test_the_ipc_trainer_sends_alone_packed_through_a_buffer_for_the_largest_tensor(monkeypatch):
    """Finding 2: vLLM's IPC trainer all-gathers the handles and meets at a barrier on the default
    group, which only rank 0 (the engine's process) would enter. This one sends alone; it is
    packed (a staging buffer on the GPU, which CPU-held weights are copied into), with a buffer as
    large as the largest tensor."""
    from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerWeightTransferEngine

    from agent.engines import vllm_transfer

    # a default group of 4 ranks whose collectives would hang with one rank in them
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda *a: 4)

    def hangs(*args, **kwargs):
        raise AssertionError("a collective on the default group, entered by rank 0 alone")

    monkeypatch.setattr(torch.distributed, "all_gather_object", hangs)
    monkeypatch.setattr(torch.distributed, "barrier", hangs)
    monkeypatch.setattr(torch.cuda, "ipc_collect", lambda: None)
    # vLLM's own trainer does enter them
    with pytest.raises(AssertionError, match="rank 0 alone"):
        IPCTrainerWeightTransferEngine._all_gather_and_merge_handles(
            object.__new__(IPCTrainerWeightTransferEngine), [{"u": (1,)}])
    # the constructor asks CUDA for this GPU's index and uuid
    monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: type("P", (), {"uuid": "GPU-0"})())

    class Client:
        def __init__(self):
            self.init = None

        def init_weight_transfer_engine(self, info):
            self.init = info

    big = torch.zeros(3 << 20, dtype=torch.bfloat16)  # 6 MiB on the CPU, over the 1 MiB bucket
    source = vllm_transfer.TensorsSource([("embed", big), ("norm", torch.ones(8))])
    client = Client()
    trainer = vllm_transfer.make_trainer("ipc", client, source, bucket_bytes=1 << 20)
    assert trainer.packed and client.init == {"packed": True}
    assert trainer.packed_buffer_size_bytes == big.numel() * big.element_size()
    handles = [{"GPU-0": (1, 2)}]
    assert trainer._all_gather_and_merge_handles(handles) is handles
    trainer._post_send_sync()
    with pytest.raises(ValueError, match="runtime=ray"):
        vllm_transfer.make_trainer("nccl", client, source, bucket_bytes=1 << 20)


# ---- the context against the model's positions ----

def test_context_limit_follows_vllms_rules():
    assert context_limit({"max_position_embeddings": 40960}) == 40960
    # YaRN leaves max_position_embeddings as the scaled length (vLLM 0.32 does not multiply again)
    yarn = {"max_position_embeddings": 40960, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    assert context_limit(yarn) == 40960 and rope_scaling_of(yarn)["rope_type"] == "yarn"
    assert context_limit({"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 2}}) == 8192
    assert rope_scaling_of({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}) is None
    assert context_limit({}) is None


def test_a_context_past_the_models_positions_is_refused_before_anything_starts(tmp_path):
    from transformers import Qwen3Config

    Qwen3Config(max_position_embeddings=40960, num_hidden_layers=1).save_pretrained(tmp_path)
    check_context(str(tmp_path), 40960)
    with pytest.raises(ContextTooLong, match=r"engine.options.max_model_len=131072 .*max_position_embeddings=40960"):
        check_context(str(tmp_path), 131072)
    check_context("Org/not-in-the-cache", 10**9)  # unreadable here: left to the engine


def test_the_megatron_learner_refuses_a_scaled_rope():
    """mbridge 0.15 passes rope_theta to Megatron and nothing of rope_scaling: its logprobs
    would differ from vLLM's, which applies YaRN."""
    from transformers import Qwen3Config

    from training.learners.mcore.model import Layout, LayoutError, check_layout

    plain = Qwen3Config(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                        intermediate_size=32, hidden_size=32)
    check_layout(Layout(), plain, world=1)
    yarn = Qwen3Config(**{**plain.to_dict(), "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                             "original_max_position_embeddings": 32768}})
    with pytest.raises(LayoutError, match="rope_scaling"):
        check_layout(Layout(), yarn, world=1)


# ---- replicas ----

def test_the_router_passes_sleep_and_wake_to_its_replicas():
    from agent.engines.router import EngineRouter

    class Replica:
        version = 0

        def __init__(self, sleeps):
            self.sleep_during_step, self.calls = sleeps, []

        def sleep(self):
            self.calls.append("sleep")

        def wake_up(self):
            self.calls.append("wake")

    replicas = [Replica(True), Replica(True)]
    router = EngineRouter(replicas)
    assert router.sleep_during_step
    router.sleep()
    router.wake_up()
    assert all(r.calls == ["sleep", "wake"] for r in replicas)
    assert not EngineRouter([Replica(False)]).sleep_during_step


def test_local_replicas_on_gpus_are_refused(monkeypatch):
    from hydra import compose, initialize_config_dir

    from training.config import CONF, ConfigError, check

    with initialize_config_dir(str(CONF), version_base=None):
        cfg = compose("config", overrides=["engine.replicas=2"])
    cuda(monkeypatch, False)
    check(cfg)
    cuda(monkeypatch, True)
    with pytest.raises(ConfigError, match="engine.replicas"):
        check(cfg)


# ---- the run's start ----

def compose(*overrides):
    from training.plan import compose as plan_compose  # training.run's composition

    return plan_compose(list(overrides))


def test_a_model_with_no_algo_overrides_makes_its_algo():
    """conf/model/qwen3.yaml's `algo_overrides: {}` is an empty (falsy) DictConfig: `or {}` handed
    OmegaConf.to_container a plain dict, which it refuses, and +experiment=swe_verified died there."""
    from training.factories import make_algo

    algo = make_algo(compose("+experiment=swe_verified"))
    assert algo.lr_policy == compose("+experiment=swe_verified").algo.lr_policy


def test_the_engine_share_comes_from_the_plan_on_a_gpu(monkeypatch):
    from training.plan import engine_share, planned_share

    cfg = compose("+experiment=swe_verified")
    cuda(monkeypatch, False)
    assert planned_share(cfg) is None  # CPU: the engine's own default
    cuda(monkeypatch, True)
    h100 = 80 * 10**9
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: type("P", (), {"total_memory": h100})())
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    share = planned_share(cfg)
    assert share == engine_share(cfg, h100) and 0.1 < share < 0.9
    assert planned_share(compose("+experiment=swe_verified", "engine.options.gpu_memory_utilization=0.3")) is None


def test_a_context_past_the_models_positions_stops_the_run_with_exit_2(tmp_path, capsys):
    from agent.tiny_model import build_tiny_model
    from training.run import run

    path = build_tiny_model(tmp_path / "tiny")  # 16,384 positions
    code = run(compose(f"model.path={path}", "engine=vllm", "engine.options.max_model_len=65536"))
    assert code == 2
    assert "engine.options.max_model_len=65536" in capsys.readouterr().err
