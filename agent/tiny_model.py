"""The embedded default model: a tiny Qwen2-architecture model built from a config, with a
byte-level BPE tokenizer trained offline on the built-in tasks' sources and the agent's prompts, and a ChatML
chat template that renders tools and `<tool_call>` tags. Both engines (transformers, vLLM)
load the saved directory like any HF checkpoint.

    python -m agent.tiny_model [--out .cache/models/tiny-qwen2] [--force]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DIR = ROOT / ".cache" / "models" / "tiny-qwen2"
TEMPLATE = Path(__file__).parent / "templates" / "chatml_tools.jinja"
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Tool tags are single tokens but not "special": decoding keeps them, so a parser sees them.
TOOL_TAGS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
# The built-in tasks' real sources (code, tests, docs) and the agent's own prompt files:
# text that rarely changes, so the tiny model stays the same from commit to commit.
CORPUS_GLOBS = ["taskdata/builtin/sources/**/*.py", "taskdata/builtin/sources/**/*.rst", "taskdata/builtin/sources/**/*.md",
                "agent/tools.yaml", "agent/prompts/*", "agent/templates/*.jinja", "envs/prompts/*"]

# head_dim 64: vLLM's CPU attention refuses 16; 2 heads x 64 = hidden 128.
MODEL_CONFIG = dict(
    hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=2,
    num_key_value_heads=1, head_dim=64, max_position_embeddings=16384, rope_theta=10000.0,
    rms_norm_eps=1e-6, tie_word_embeddings=True, torch_dtype="float32",
)


def corpus_files(root: Path = ROOT) -> list[Path]:
    """The project's own files: hidden folders (.venv, .pytest_cache, ...), run outputs and
    built repositories left out, so every checkout trains the same tokenizer."""
    def ours(p: Path) -> bool:
        rel = p.relative_to(root).parts
        return p.is_file() and not any(part.startswith(".") for part in rel) and rel[0] != "outputs" \
            and rel[:3] != ("taskdata", "builtin", "repos")

    return sorted({p for g in CORPUS_GLOBS for p in root.glob(g) if ours(p)})


def train_tokenizer(vocab_size: int = 4096, root: Path = ROOT):
    """A byte-level BPE tokenizer (tokenizers library) as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    texts = [p.read_text(errors="replace") for p in corpus_files(root)]
    texts.append(TEMPLATE.read_text())
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None,
        unk_token=None, model_max_length=MODEL_CONFIG["max_position_embeddings"],
    )
    fast.add_tokens(TOOL_TAGS)
    fast.chat_template = TEMPLATE.read_text()
    return fast


def build_tiny_model(out: Path = DEFAULT_DIR, seed: int = 0, force: bool = False) -> Path:
    """Write the tiny model and its tokenizer to `out` (skipped when already there)."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    out = Path(out)
    if not force and (out / "config.json").exists() and (out / "tokenizer.json").exists():
        return out
    tokenizer = train_tokenizer()
    vocab = len(tokenizer)
    config = Qwen2Config(
        vocab_size=vocab, bos_token_id=None, eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id, **MODEL_CONFIG,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    # written beside and renamed into place: no half-written model after a crash, and of two
    # processes building it at once the first rename wins (the same bytes either way)
    staging = out.with_name(f".{out.name}.{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    model.save_pretrained(staging)
    GenerationConfig(eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id).save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    if force or not (out / "tokenizer.json").exists():
        shutil.rmtree(out, ignore_errors=True)
    try:
        staging.rename(out)
    except OSError:  # built meanwhile by another process
        shutil.rmtree(staging, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m agent.tiny_model", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_DIR)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true")
    args = p.parse_args(argv)
    path = build_tiny_model(args.out, args.seed, args.force)
    print(f"tiny model: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
