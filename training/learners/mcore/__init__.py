"""megatron-core for the Megatron learner: models through mbridge, sequence packing, and the CPU
redirection that lets tests run it without CUDA."""
