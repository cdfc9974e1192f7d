"""The model side: the decoder and its attention kernels, loading, tokenizing, sampling, the model runner and the decode
graphs. The package itself imports nothing, so its plain-data modules (``model_config``, ``tokenizer``) import
without torch."""
