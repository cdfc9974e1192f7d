"""Who runs next and where its KV lives: the batching policy (and its static-batching baseline), the tiered queues,
premium's reservation of KV blocks and batch slots, the paged KV block manager and the block moves of a step. No
torch."""
