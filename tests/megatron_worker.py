"""The Megatron learner's checks that need several ranks: run by tests/test_megatron.py under
`torchrun --nproc-per-node 2` (gloo, CPU, fp32). Rank 0 writes what it measured as JSON.

    torchrun --nproc-per-node 2 tests/megatron_worker.py roundtrip OUT.json MODEL [MODEL ...]
    torchrun --nproc-per-node 2 tests/megatron_worker.py step OUT.json MODEL CRITIC REFERENCE.pt
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from training.learners.mcore import cpu  # noqa: E402

cpu.enable()

from training.learners.mcore import model as mm  # noqa: E402
from tests.megatron_batch import ALGOS, BATCH, GROUPS, make_algo  # noqa: E402


def logits_of(chunks, ids: torch.Tensor) -> torch.Tensor | None:
    """[1, T, V] full-vocabulary logits on the last pipeline stage (None elsewhere), through
    megatron's schedule (the pipeline passes activations between stages)."""
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    T = ids.shape[1]
    mask = ~torch.ones(T, T, dtype=torch.bool).tril()[None, None]
    got = []

    def step(it, chunk):
        next(it)
        out = chunk(ids, torch.arange(T)[None], mask)
        return out, lambda o: (o.sum() * 0, torch.tensor(0, dtype=torch.int), got.append(o.detach()) or {})

    with torch.no_grad():
        get_forward_backward_func()(forward_step_func=step, data_iterator=iter([0]), model=chunks, num_microbatches=1,
                                    seq_length=T, micro_batch_size=1, forward_only=True)
    if not ps.is_pipeline_last_stage():
        return None
    # the policy hands back its final hidden states (training/learners/mcore/logprobs.py): logits from
    # them and this rank's vocab shard of the output weight, then the whole vocabulary
    weight = mm._unwrap(chunks[-1]).output_layer.loss_weight
    return gather_from_tensor_model_parallel_region(got[0] @ weight.t())


def roundtrip(out: str, paths: list[str]) -> None:
    from transformers import AutoModelForCausalLM

    results = []
    for path in paths:
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        reference = hf.state_dict()
        if hf.config.tie_word_embeddings:
            reference.pop("lm_head.weight")
        ids = torch.randint(0, hf.config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            ref_logits = hf(ids).logits
        for tp, pp in ((2, 1), (1, 2)):
            layout = mm.Layout(tensor_parallel=tp, pipeline_parallel=pp)
            mm.init_parallel(layout, seed=0)
            config = mm.hf_config_of(path)
            bridge = mm.make_bridge(config, torch.float32, layout)
            chunks = mm.build(bridge, path)
            exported = mm.gather_hf(bridge, chunks)  # rank 0 keeps them
            logits = logits_of(chunks, ids)
            row = {"model": config.model_type, "tp": tp, "pp": pp}
            if dist.get_rank() == 0:
                row.update(names_equal=sorted(exported) == sorted(reference),
                           max_weight_diff=max(float((exported[k] - reference[k]).abs().max()) for k in reference))
            if logits is not None:
                row["max_logit_diff"] = float((logits - ref_logits).abs().max())
            rows = [None] * dist.get_world_size()
            dist.all_gather_object(rows, row)
            results.append({k: v for r in rows for k, v in r.items()})  # the last stage's logit diff
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(results, indent=1))


def step(out: str, path: str, critic: str, reference: str, save_dir: str) -> None:
    """One SAO and one GRPO step at TP=1 (DP=2), TP=2 (+ recompute) and (SAO) PP=2, and the other
    loss means and orderings, against the torch learner's; then a
    TP=2 checkpoint: loaded, the next step is the saver's next step; under TP=1 (another
    layout) it is refused."""
    from training.learners.megatron import MegatronLearner

    results = []
    # (tensor, pipeline); the other averaging and ordering at two data-parallel ranks and at TP=2
    layouts = {"sao": ((1, 1), (2, 1), (1, 2)), "grpo": ((1, 1), (2, 1)), "sao_seq_after": ((1, 1), (2, 1)),
               "grpo_seq_unbiased": ((1, 1),)}
    for name in ALGOS:
        for tp, pp in layouts[name]:
            # TP=2 also recomputes activations (with sequence parallel) and takes logprobs 16 tokens
            # at a time: the same numbers
            learner = MegatronLearner(path, make_algo(name), value_checkpoint=critic, tensor_parallel=tp,
                                      pipeline_parallel=pp, micro_batch_tokens=40, recompute=tp == 2,
                                      logprob_chunk=16 if tp == 2 else 1024)
            metrics = learner.step(BATCH, GROUPS)
            weights = dict(learner.state_dict_for_engine())
            if dist.get_rank() == 0:
                ref = torch.load(reference, weights_only=False)[name]
                results.append({"algo": name, "tp": tp, "pp": pp, "metrics": metrics, "ref_metrics": ref["metrics"],
                                "max_weight_diff": max(float((weights[k] - v).abs().max()) for k, v in ref["weights"].items()),
                                "moved": max(float((weights[k] - v).abs().max()) for k, v in ref["start"].items())})
            if name == "sao" and tp == 2:
                learner.save(save_dir)
                after_save = learner.step(BATCH, GROUPS)
    # a learner loaded from the checkpoint takes the same next step as the one that saved it
    resumed = MegatronLearner(path, make_algo("sao"), value_checkpoint=critic, tensor_parallel=2, micro_batch_tokens=40,
                              recompute=True, logprob_chunk=16)
    resumed.load(save_dir)
    resumed_step = resumed.step(BATCH, GROUPS)
    refused = ""
    try:
        MegatronLearner(path, make_algo("sao"), value_checkpoint=critic, tensor_parallel=1).load(save_dir)
    except mm.LayoutError as e:
        refused = str(e)
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps({"steps": results, "refused": refused, "after_save": after_save,
                                         "resumed": resumed_step}, indent=1))


if __name__ == "__main__":
    dist.init_process_group("gloo")
    kind, out, *args = sys.argv[1:]
    with cpu.scope():
        if kind == "roundtrip":
            roundtrip(out, args)
        else:
            step(out, *args)
    dist.barrier()
    dist.destroy_process_group()
