"""The embedded tiny model and the transformers engine, on real weights (CPU)."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agent.engines.base import SamplingParams
from agent.engines.hf import HFEngine, processed_logprobs
from agent.tiny_model import build_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def test_tiny_model_loads_with_tools_template(tiny):
    tok = AutoTokenizer.from_pretrained(tiny)
    model = AutoModelForCausalLM.from_pretrained(tiny)
    assert model.config.model_type == "qwen2" and model.config.head_dim == 64
    tools = [{"type": "function", "function": {"name": "bash", "description": "run a command",
                                               "parameters": {"type": "object", "properties": {}}}}]
    msgs = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "bash", "arguments": {"command": "ls"}}}]},
            {"role": "tool", "content": "a.py"}]
    text = tok.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=True)
    assert '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>' in text
    assert "<|im_start|>user\n<tool_response>\na.py\n</tool_response><|im_end|>\n<|im_start|>assistant\n" in text
    assert '"name": "bash"' in text.split("</tools>:\n<tools>")[1].split("</tools>")[0]
    # tool tags are single tokens, and decoding keeps them
    ids = tok.encode("<tool_call>x</tool_call>")
    assert tok.convert_ids_to_tokens(ids)[0] == "<tool_call>" and tok.decode(ids) == "<tool_call>x</tool_call>"


def test_processed_logprobs_by_hand():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.2]))
    # top_p 0.7: 0.5 alone is short of 0.7, so {0.5, 0.3} stay, renormalised to 0.625 / 0.375
    lp = processed_logprobs(logits, 1.0, 0.7).exp()
    assert torch.allclose(lp, torch.tensor([0.625, 0.375, 0.0]), atol=1e-6)
    # temperature 0.5 squares then renormalises: 0.25, 0.09, 0.04 over 0.38
    lp = processed_logprobs(logits, 0.5, 1.0).exp()
    assert torch.allclose(lp, torch.tensor([0.25, 0.09, 0.04]) / 0.38, atol=1e-6)


def test_generate_logprobs_match_a_full_forward_and_seed_repeats(tiny):
    engine = HFEngine(str(tiny))
    prompt = [5, 6, 7, 8]
    c = engine.generate(prompt, SamplingParams(max_new_tokens=24, seed=3))
    assert len(c.token_ids) == len(c.logprobs) == 24 and c.finish_reason == "length"
    assert engine.generate(prompt, SamplingParams(max_new_tokens=24, seed=3)).token_ids == c.token_ids
    with torch.no_grad():
        logits = engine.model(torch.tensor([prompt + c.token_ids])).logits[0]
    ref = torch.log_softmax(logits.float(), -1)[len(prompt) - 1 : -1].gather(1, torch.tensor(c.token_ids)[:, None])
    assert torch.allclose(ref[:, 0], torch.tensor(c.logprobs), atol=1e-4)


def test_stop_token_ends_and_is_kept(tiny):
    engine = HFEngine(str(tiny))
    first = engine.generate([5, 6], SamplingParams(max_new_tokens=1, temperature=0)).token_ids[0]
    c = engine.generate([5, 6], SamplingParams(max_new_tokens=10, temperature=0, stop_token_ids=(first,)))
    assert c.token_ids == [first] and c.finish_reason == "stop"


def test_update_weights_changes_outputs_and_version(tiny):
    engine = HFEngine(str(tiny))
    other = AutoModelForCausalLM.from_pretrained(tiny)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    engine.update_weights(other.state_dict().items(), version=7)
    assert engine.version == 7
    x = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        assert torch.allclose(engine.model(x).logits, other(x).logits, atol=1e-5)
    with pytest.raises(KeyError, match="no parameter 'nope'"):
        engine.update_weights([("nope", torch.zeros(1))], version=8)


def test_dtype_and_device_are_the_engines_own(tiny, monkeypatch):
    from agent.engines import make_engine

    engine = make_engine("hf", str(tiny), device="cpu", dtype="bfloat16")  # eval's --dtype bfloat16
    assert engine.model.dtype == torch.bfloat16 and engine.device == "cpu"
    c = engine.generate([5, 6, 7], SamplingParams(max_new_tokens=4, seed=0))
    assert len(c.token_ids) == 4 and all(lp <= 0 for lp in c.logprobs)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    engine = make_engine("hf", str(tiny), device="auto", dtype="auto")  # a machine without CUDA
    assert engine.model.dtype == torch.float32 and engine.device == "cpu"
    with pytest.raises(ValueError, match="device 'cuda': CUDA is not available"):
        make_engine("hf", str(tiny), device="cuda")
