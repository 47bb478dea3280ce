"""What the project's weight-transfer backends (`inline`, `collective`) share on vLLM's worker
side: weights arrive in checkpoint format, so a sync runs inside vLLM's layerwise reload, started
before the first bucket and finished after the last (as vLLM's own IPC and NCCL backends do)."""

from __future__ import annotations


class LayerwiseReload:
    """Mixin for a `WeightTransferEngine` (it has `model` and `model_config`)."""

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)
