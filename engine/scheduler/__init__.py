"""Who runs next and where its KV lives: the batching policy, the tiered queues, the paged KV block manager and the
block moves of a step. No torch."""
