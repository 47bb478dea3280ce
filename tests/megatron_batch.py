"""What the Megatron learner's tests share between the pytest process (the torch learner's
reference) and the torchrun worker: tiny models whose heads split over two tensor-parallel
ranks, one batch, one algorithm setting each."""

from __future__ import annotations

from pathlib import Path

from tests.test_learner import traj
from training.algos import GRPO, SAO


BATCH = [traj(1.0), traj(0.0, 20), traj(1.0, 5), traj(0.0, 8)]
GROUPS = [0, 0, 1, 1]


def make_algo(name: str):
    if name == "sao":  # no warm-up: this one step updates critic (K = 2) and policy
        return SAO(critic_warmup_steps=0, lr_policy=1e-3, lr_critic=1e-3)
    if name == "sao_seq_after":  # each trajectory's token mean; advantages from the updated critic's values
        return SAO(critic_warmup_steps=0, lr_policy=1e-3, lr_critic=1e-3, token_mean="seq_mean_token_mean",
                   values_after_critic=True)
    # four mini-batches of one row: at two data-parallel ranks one of them has no rows each time
    if name == "grpo_seq_unbiased":
        return GRPO(group_size=2, lr_policy=1e-3, policy_minibatches=4, token_mean="seq_mean_token_mean",
                    group_std="unbiased")
    return GRPO(group_size=2, lr_policy=1e-3, policy_minibatches=4)


ALGOS = ("sao", "grpo", "sao_seq_after", "grpo_seq_unbiased")


def make_tiny(out: Path, model_type: str) -> Path:
    """A tiny Qwen2 (tied embeddings, QKV bias) or Qwen3 (untied, q/k norms) with the embedded
    model's tokenizer, 2 query and 2 key-value heads: TP=2 splits them."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen3Config

    from agent.tiny_model import DEFAULT_DIR, build_tiny_model

    tokenizer = AutoTokenizer.from_pretrained(build_tiny_model(DEFAULT_DIR))
    common = dict(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=2, head_dim=64, max_position_embeddings=4096,
                  rms_norm_eps=1e-6)
    config = Qwen2Config(**common, tie_word_embeddings=True) if model_type == "qwen2" else \
        Qwen3Config(**common, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
